// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Logging
import Observation
import ParleyKit
import ParleyProtocol
import ParleyRooms
import WebRTC

/// What the example app (and any SwiftUI app) shows and does, without the views: sign-in, the
/// calls in progress with their controls and live quality, and the call history. It lives here, not
/// in the app, so that it is compiled and tested on Linux with everything else.
@MainActor
@Observable
public final class PhoneModel {
    public enum SignIn: Equatable, Sendable {
        case signedOut
        case signingIn
        case signedIn(UserID)
    }

    /// One call as the UI shows it.
    public struct Call: Identifiable, Equatable, Sendable {
        public let id: UUID
        public var remote: UserID?
        public var outgoing: Bool
        public var video = false
        public var phase: CallStateMachine.Phase
        public var muted = false
        public var held = false
        public var speaker = false
        public var remoteMuted = false
        public var remoteHeld = false
        /// Mean opinion score (1…4.5) and bars (1…5) of the last interval; nil while nothing
        /// arrives from the far side (`receiving` false): there is nothing to rate.
        public var mos: Double?
        public var bars: Int?
        /// Whether audio arrives from the far side (false after a few seconds without a packet).
        public var receiving = true
        /// The callee is offline and nothing could wake them.
        public var calleeOffline = false
        /// Recording with consent: `.asked` wants the user's answer (`answerRecording`); `.on`
        /// shows that the other side records.
        public var recording: RecordingConsent.State = .off
    }

    /// Where the app keeps the session between launches (UserDefaults and the keychain in the app).
    public protocol SessionStore: Sendable {
        func load() -> Session?
        func save(_ session: Session?)
        /// This installation's device id, made once and kept across sign-ins (the keychain in the
        /// app): a device is the phone, not the account.
        func installationDevice() -> DeviceID
    }

    public struct Session: Codable, Equatable, Sendable {
        public var server: URL
        public var user: UserID
        public var device: DeviceID
        public init(server: URL, user: UserID, device: DeviceID) {
            self.server = server
            self.user = user
            self.device = device
        }
    }

    /// A voice room as the UI shows it.
    public struct Room: Equatable, Sendable {
        public var name: RoomID
        public var members: [RoomMember] = []
        public var talking: Set<Int64> = []
        public var mutedMembers: Set<Int64> = []
        public var muted = false
        /// Media to and from the mixer is up.
        public var connected = false
        public var reconnecting = false
    }

    public private(set) var signIn: SignIn = .signedOut
    public private(set) var room: Room?
    /// The newest peer connection: a video call shows its `remoteVideoTrack` and `localVideoTrack`
    /// (one video call at a time).
    public private(set) var media: WebRTCPeerConnection?
    private var roomSession: RoomSession?
    private var roomEvents: Task<Void, Never>?
    public private(set) var calls: [Call] = []
    public private(set) var history: [CallRecord] = []
    /// The last thing that went wrong, in a sentence for the user.
    public private(set) var problem: String?
    public private(set) var route: AudioOutput?
    public private(set) var phone: ParleyPhone?

    private let store: any SessionStore
    private let topic: String
    private let pushEnvironment: VoIPRegistration.Environment
    private let makePhone: @Sendable (ParleyPhone.Configuration) -> ParleyPhone
    /// The signed-in phone's calls, peer connections and history refreshes, heard by one task's
    /// children; cancelled at sign-out.
    private var listening: Task<Void, Never>?
    /// A call ended: the history is read again (requests not yet taken count as one).
    private var historyWanted: AsyncStream<Void>.Continuation?
    private var session: Session?

    /// - Parameters:
    ///   - makePhone: builds the phone for a signed-in user, with the app's `CallSystem`.
    public init(store: any SessionStore, topic: String, pushEnvironment: VoIPRegistration.Environment,
                makePhone: @escaping @Sendable (ParleyPhone.Configuration) -> ParleyPhone) {
        self.store = store
        self.topic = topic
        self.pushEnvironment = pushEnvironment
        self.makePhone = makePhone
    }

    /// At launch: signs the last user in again, so a VoIP push that launched the app finds the calls ready.
    public func restore() {
        guard let session = store.load() else { return }
        start(session)
    }

    /// Signs in to a server in development mode (it hands out tokens: `POST /v1/dev/tokens`). A
    /// production app gets its tokens from its own backend and calls `start` with that source.
    public func signIn(server: URL, user: String, name: String? = nil) async {
        guard let userID = UserID(rawValue: user.trimmingCharacters(in: .whitespaces)) else {
            problem = "“\(user)” is not a user id: use letters, digits and . _ - @"
            return
        }
        signIn = .signingIn
        do {
            _ = try await Self.developmentToken(server: server, user: userID, name: name)
        } catch {
            signIn = .signedOut
            problem = "\(error)"
            return
        }
        let session = Session(server: server, user: userID, device: store.installationDevice())
        store.save(session)
        start(session)
    }

    public func signOut() async {
        listening?.cancel()
        listening = nil
        historyWanted = nil
        media = nil
        await leaveRoom()
        await phone?.signOut()
        phone = nil
        calls = []
        store.save(nil)
        signIn = .signedOut
    }

    private func start(_ session: Session) {
        self.session = session
        let server = session.server, user = session.user
        let phone = makePhone(ParleyPhone.Configuration(server: server, device: session.device, topic: topic,
                                                        pushEnvironment: pushEnvironment,
                                                        token: { try await Self.developmentToken(server: server, user: user, name: nil) }))
        self.phone = phone
        signIn = .signedIn(user)
        problem = nil
        phone.start()
        let events = phone.calls.events, connections = phone.webRTC?.peerConnections
        let (history, historyWanted) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        self.historyWanted = historyWanted
        listening = Task { [weak self] in
            await withDiscardingTaskGroup { group in
                group.addTask { for await event in events { await self?.handle(event) } }
                group.addTask { for await _ in history { await self?.refreshHistory() } }
                if let connections {
                    group.addTask { for await connection in connections { await self?.show(connection) } }
                }
            }
        }
    }

    // MARK: Calls

    public func call(_ user: String, video: Bool = false) async {
        guard let phone else { return }
        guard let userID = UserID(rawValue: user.trimmingCharacters(in: .whitespaces)) else {
            problem = "“\(user)” is not a user id"
            return
        }
        do {
            let id = try await phone.call(userID, video: video)
            if !calls.contains(where: { $0.id == id }) {
                calls.append(Call(id: id, remote: userID, outgoing: true, video: video, phase: .dialing))
            }
        } catch {
            problem = "The call could not start: \(error)"
        }
    }

    public func answer(_ call: UUID) async { await perform { try await $0.answer(call) } }
    public func hangUp(_ call: UUID) async { await perform { try await $0.hangUp(call) } }

    public func toggleMute(_ call: UUID) async {
        guard let index = calls.firstIndex(where: { $0.id == call }) else { return }
        let muted = !calls[index].muted
        await perform { try await $0.setMuted(call, muted) }
        if let index = calls.firstIndex(where: { $0.id == call }) { calls[index].muted = muted }
    }

    public func toggleHold(_ call: UUID) async {
        guard let index = calls.firstIndex(where: { $0.id == call }) else { return }
        let held = !calls[index].held
        await perform { try await $0.setHeld(call, held) }
        if let index = calls.firstIndex(where: { $0.id == call }) { calls[index].held = held }
    }

    public func answerRecording(_ call: UUID, consent: Bool) async { await perform { try await $0.answerRecording(call, consent: consent) } }
    public func stopRecording(_ call: UUID) async { await perform { try await $0.stopRecording(call) } }

    public func toggleSpeaker(_ call: UUID) async {
        guard let phone, let index = calls.firstIndex(where: { $0.id == call }) else { return }
        let speaker = !calls[index].speaker
        await phone.setSpeaker(speaker)
        if let index = calls.firstIndex(where: { $0.id == call }) { calls[index].speaker = speaker }
    }

    private func perform(_ action: (ParleyPhone) async throws -> Void) async {
        guard let phone else { return }
        do { try await action(phone) } catch { problem = "The system refused: \(error)" }
    }

    // MARK: Voice rooms

    public func joinRoom(_ name: String) async {
        guard let phone, case .signedIn(let user) = signIn, roomSession == nil else { return }
        guard let id = RoomID(rawValue: name.trimmingCharacters(in: .whitespaces)) else {
            problem = "“\(name)” is not a room name: use letters, digits and . _ -"
            return
        }
        room = Room(name: id)
        do {
            let session = try await phone.joinRoom(id, display: user.rawValue)
            roomSession = session
            let events = session.events
            roomEvents = Task { [weak self] in
                for await event in events { self?.handle(event) }
            }
            // Joined before the events were read: who is there now.
            room?.members = await session.participants
        } catch {
            room = nil
            problem = "The room could not be joined: \(error)"
        }
    }

    public func leaveRoom() async {
        guard let phone, let session = roomSession else { return }
        roomSession = nil
        await phone.leave(session)
        roomEvents?.cancel()
        room = nil
    }

    public func toggleRoomMute() async {
        guard let session = roomSession, let muted = room?.muted else { return }
        do {
            try await session.setMuted(!muted)
            room?.muted = !muted
        } catch {
            problem = "Mute did not reach the room: \(error)"
        }
    }

    func handle(_ event: RoomEvent) {
        guard room != nil else { return }
        switch event {
        case .joined(_, let participants):
            room?.members = participants
            room?.reconnecting = false
        case .memberJoined(let member):
            if room?.members.contains(where: { $0.id == member.id }) == false { room?.members.append(member) }
        case .memberLeft(let member):
            room?.members.removeAll { $0.id == member.id }
            room?.talking.remove(member.id)
        case .talking(let member, let talking):
            if talking { room?.talking.insert(member.id) } else { room?.talking.remove(member.id) }
        case .muted(let member, let muted):
            if muted { room?.mutedMembers.insert(member.id) } else { room?.mutedMembers.remove(member.id) }
        case .connected, .hearing:
            room?.connected = true
        case .reconnecting:
            room?.reconnecting = true
            room?.connected = false
        case .ended(let reason):
            if reason != "left" { problem = "You left the room: \(reason)" }
            roomSession = nil
            room = nil
        }
    }

    private func show(_ connection: WebRTCPeerConnection) { media = connection }

    /// The user read the problem.
    public func dismissProblem() { problem = nil }

    /// The user's calls, newest first (`GET /v1/calls`).
    public func refreshHistory() async {
        guard let session, let phone else { return }
        do {
            var request = URLRequest(url: session.server.appendingPathComponent("v1/calls"))
            request.setValue("Bearer \(try await phone.configuration.token())", forHTTPHeaderField: "Authorization")
            let (data, response) = try await URLSession.shared.dataCancellably(for: request)
            guard (response as? HTTPURLResponse)?.statusCode == 200 else { throw ModelError("the server did not give the history") }
            history = try JSONDecoder().decode(CallList.self, from: data).calls
        } catch {
            problem = "The history could not be loaded: \(error)"
        }
    }

    // MARK: Events

    func handle(_ event: CallEvent) {
        switch event {
        case .phase(let id, let phase):
            if let index = calls.firstIndex(where: { $0.id == id }) {
                calls[index].phase = phase
            }
            if phase.isEnded {
                calls.removeAll { $0.id == id }
                historyWanted?.yield()
            }
        case .incoming(let id, let from, _, let video):
            if !calls.contains(where: { $0.id == id }) { calls.append(Call(id: id, remote: from, outgoing: false, video: video, phase: .ringing)) }
        case .remoteUpdated(let id, let muted, let held):
            guard let index = calls.firstIndex(where: { $0.id == id }) else { return }
            if let muted { calls[index].remoteMuted = muted }
            if let held { calls[index].remoteHeld = held }
        case .quality(let id, let report):
            guard let index = calls.firstIndex(where: { $0.id == id }) else { return }
            calls[index].mos = report.mos
            calls[index].bars = report.score
        case .invited(let id, let devices, let pushed):
            guard let index = calls.firstIndex(where: { $0.id == id }) else { return }
            calls[index].calleeOffline = devices == 0 && pushed == 0
        case .recording(let id, let state, _):
            guard let index = calls.firstIndex(where: { $0.id == id }) else { return }
            calls[index].recording = state
        case .route(let output):
            route = output
        case .receivingMedia(let id, let receiving):
            guard let index = calls.firstIndex(where: { $0.id == id }) else { return }
            calls[index].receiving = receiving
            if !receiving {
                calls[index].mos = nil
                calls[index].bars = nil
            }
        case .bitrate, .pausedByInterruption, .recorded:
            break
        }
    }

    // MARK: Tokens

    struct ModelError: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    static func developmentToken(server: URL, user: UserID, name: String?) async throws -> String {
        var request = URLRequest(url: server.appendingPathComponent("v1/dev/tokens"))
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = try JSONEncoder().encode(DevTokenRequest(user: user, name: name))
        let data: Data, response: URLResponse
        do {
            (data, response) = try await URLSession.shared.dataCancellably(for: request)
        } catch {
            throw ModelError("The server at \(server.absoluteString) cannot be reached.")
        }
        guard (response as? HTTPURLResponse)?.statusCode == 200 else {
            throw ModelError("This server does not hand out development tokens: sign in through your app's backend.")
        }
        return try JSONDecoder().decode(DevTokenResponse.self, from: data).token
    }
}
#endif
