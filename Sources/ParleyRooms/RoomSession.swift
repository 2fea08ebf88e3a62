import Foundation
import Logging
import ParleyJanus
import ParleyKit
import ParleyProtocol

/// What happens in a voice room, as `RoomSession` reports it.
public enum RoomEvent: Hashable, Sendable {
    /// Joined (again, after a reconnect): who is there, ourselves included.
    case joined(room: RoomID, participants: [RoomMember])
    case memberJoined(RoomMember)
    case memberLeft(RoomMember)
    case talking(RoomMember, Bool)
    case muted(RoomMember, Bool)
    /// Media to and from the mixer is up.
    case connected
    /// The first mixed audio was decoded.
    case hearing
    /// Janus went away; the session joins again by itself.
    case reconnecting(reason: String)
    /// Left, or removed (kicked, room destroyed).
    case ended(reason: String)
}

/// A participant of an AudioBridge room.
public struct RoomMember: Hashable, Sendable {
    public var id: Int64
    public var display: String
    public var isSelf: Bool
}

/// Why a room could not be joined, in words for the user.
public struct RoomError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// One device in an AudioBridge room: `room.join` on the Parley server, then Janus directly —
/// session, AudioBridge handle, join with the server's token, an offer that sends audio levels for
/// talking detection, keepalives; it joins again by itself when Janus restarts. Media comes from
/// any `PeerConnectionFactory`: the GStreamer engine on Linux, WebRTC on iPhone.
public actor RoomSession {
    public nonisolated let events: AsyncStream<RoomEvent>
    public let room: RoomID
    public let display: String
    private let sink: AsyncStream<RoomEvent>.Continuation
    private let signaling: SignalingClient<ContinuousClock>
    private let peers: any PeerConnectionFactory
    private let connectJanus: JanusConnector
    private let logger: Logger
    private var client: JanusClient?
    private var bridge: AudioBridge?
    private var peer: (any PeerConnection)?
    private var participantID: Int64?
    private var members: [Int64: RoomMember] = [:]
    /// The session's one task, from `join()` to `leave()` (which cancels it) or the end: it
    /// connects to Janus, runs the connection's loops (mixer events, the Janus session's end, the
    /// peer's events) as children, and joins again after a loss.
    private var running: Task<Void, Never>?
    private var muted = false
    /// Left, or ended (kicked, the room destroyed): the session does not join again.
    private var leaving = false
    /// The ticket a `room.join` on a new signaling session brought when the server could not keep
    /// this device's admission: the session joins Janus again with it (`rejoinServer`).
    private var replacement: RoomMedia.Janus?
    /// Tells the connection to Janus that runs (`serve`) that its admission was replaced.
    private var replaced: AsyncStream<Void>.Continuation?
    /// A `room.join` on a new signaling session is in flight: a kick of this device meanwhile is the
    /// server replacing its admission, not removing it from the room.
    private var rejoining = false

    /// How a room reaches Janus at the URL its ticket names: SwiftNIO's WebSocket client by default;
    /// URLSession on an iPhone (`URLSessionJanusTransport`).
    public typealias JanusConnector = @Sendable (_ url: String) async throws -> any JanusTransport

    /// - Parameters:
    ///   - peers: makes the room's peer connection; its offers must carry the `ssrc-audio-level`
    ///     header extension, which the mixer's talking detection reads.
    ///   - janus: opens the connection to Janus.
    public init(room: RoomID, display: String, signaling: SignalingClient<ContinuousClock>, peers: any PeerConnectionFactory,
                janus: @escaping JanusConnector = { try await JanusWebSocketTransport.connect(to: $0) }, logger: Logger) {
        self.room = room
        self.display = display
        self.signaling = signaling
        self.peers = peers
        connectJanus = janus
        self.logger = logger
        (events, sink) = AsyncStream.makeStream()
    }

    /// Who is in the room now.
    public var participants: [RoomMember] { members.values.sorted { $0.display < $1.display } }

    /// Joins: `room.join`, then Janus. Throws with a plain message when either refuses; once
    /// joined, the session joins again by itself when Janus goes away, until `leave()`.
    public func join() async throws {
        guard running == nil, !leaving else { return }
        // From before the first join: a session that starts anew from then on is one to join again in.
        let sessions = await signaling.sessionStarts()
        let ticket = try await admission()
        let (outcomes, outcome) = AsyncStream.makeStream(of: (any Error)?.self)
        let session = Task {
            await withDiscardingTaskGroup { group in
                group.addTask {
                    for await welcome in sessions where !welcome.resumed { await self.rejoinServer() }
                }
                await self.run(first: ticket, joined: outcome)
                group.cancelAll()
            }
        }
        running = session
        // A caller that stops waiting (cancelled) takes the session with it.
        let joined: (any Error)?? = await withTaskCancellationHandler {
            for await failure in outcomes { return failure }
            return nil
        } onCancel: {
            session.cancel()
        }
        guard case .some(.none) = joined else {
            // Not joined: nothing runs, and `join()` may be tried again.
            session.cancel()
            running = nil
            throw joined.flatMap { $0 } ?? CancellationError()
        }
    }

    /// `room.join` on the server: the ticket to the room's AudioBridge (a new token each time, and
    /// the room created again when Janus lost it). `keeping`: the participant this device is in
    /// Janus now, for the server to keep (the ticket then names it again).
    private func admission(keeping participant: Int64? = nil) async throws -> RoomMedia.Janus {
        let ack: Ack
        let room = self.room, display = self.display
        do {
            ack = try await signaling.request { .roomJoin(RoomJoin(id: $0, room: room, display: display, participant: participant)) }
        } catch {
            throw RoomError("the server refused to join room \(room): \(error)")
        }
        let joined = try ack.decodeResult(RoomJoinResult.self)
        guard joined.media.mode == "audiobridge", let janus = joined.media.janus else {
            throw RoomError("room \(room) is a \(joined.media.mode) room; voice rooms need AudioBridge (start the server with --janus)")
        }
        return janus
    }

    /// The server started a new signaling session for this device (it restarted, or the device's
    /// node went away and it came back through another), whose room may list its members anew: `room.join` again, naming the
    /// Janus participant this device is, so it is listed as before. The server keeps that admission
    /// while Janus has the participant, and the media goes on untouched; otherwise its new ticket
    /// replaces the old one, and the session joins Janus again with it.
    private func rejoinServer() async {
        guard !leaving, let participant = participantID, client != nil else {
            // Not in Janus now: the session's loop joins the server again itself when it next joins Janus.
            return
        }
        rejoining = true
        kickedWhileRejoining = false
        defer { rejoining = false }
        do {
            let ticket = try await admission(keeping: participant)
            if ticket.participant != participant {
                logger.notice("the server made a new room admission; joining Janus again with it")
                replacement = ticket
            } else if !kickedWhileRejoining {
                return
            }
            // Kept, but kicked meanwhile (another admission of this device took its place): the
            // session's loop asks the server for a ticket again.
        } catch {
            // Still in Janus, and talking; the server will list this device once Janus next makes it join.
            logger.notice("joining the room again on a new signaling session failed", metadata: ["error": "\(error)"])
            guard kickedWhileRejoining else { return }
        }
        replaced?.yield()
    }

    private var kickedWhileRejoining = false

    /// The session: Janus with the first ticket, then, each time Janus goes away or the connection
    /// drops, a new ticket and Janus again, with backoff. `joined` hears how the first join went.
    private func run(first: RoomMedia.Janus, joined: AsyncStream<(any Error)?>.Continuation) async {
        var ticket: RoomMedia.Janus? = first
        var attempt = 0
        var joinedOnce = false
        while !leaving, !Task.isCancelled {
            if ticket == nil {
                attempt += 1
                do { try await Task.sleep(for: .milliseconds(min(5000, 250 * (1 << min(attempt, 5))))) } catch { break }
                do {
                    ticket = try await admission()
                } catch {
                    logger.info("rejoining the room failed; trying again", metadata: ["error": "\(error)"])
                    continue
                }
            }
            guard let janus = ticket else { continue }
            ticket = nil
            do {
                let lost = try await serve(janus) {
                    attempt = 0
                    joinedOnce = true
                    joined.yield(nil)
                    joined.finish()
                }
                await teardownMedia()
                ticket = takeReplacement()
                guard let lost, !leaving else { break }
                sink.yield(.reconnecting(reason: lost))
            } catch {
                await teardownMedia()
                ticket = takeReplacement()
                if !joinedOnce {
                    // The first join: its caller hears why, and the session is over.
                    joined.yield(RoomError("cannot join the voice room on Janus at \(janus.url): \(error)"))
                    joined.finish()
                    return
                }
                logger.info("rejoining the room failed; trying again", metadata: ["error": "\(error)"])
            }
        }
        joined.finish()
    }

    /// The ticket the server replaced this device's admission with, if it did: the next connection
    /// to Janus uses it (straight away, without asking the server again).
    private func takeReplacement() -> RoomMedia.Janus? {
        defer { replacement = nil }
        return leaving ? nil : replacement
    }

    /// One connection to Janus: session, AudioBridge handle, join, and the offer and answer, with
    /// the connection's loops running from the start; `connected` is told once media is negotiated.
    /// Answers why the connection was lost, or nil when it ended (left, kicked, cancelled).
    private func serve(_ ticket: RoomMedia.Janus, connected: () -> Void) async throws -> String? {
        let (replacements, replaced) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        self.replaced = replaced
        defer { replaced.finish() }
        let transport = try await connectJanus(ticket.url)
        let client = JanusClient(transport: transport)
        self.client = client
        try await client.createSession()
        let bridge = try await AudioBridge.attach(client, opaqueID: "parley-\(room)")
        self.bridge = bridge
        let result = try await bridge.join(room: ticket.room, display: display, token: ticket.token, muted: muted, id: ticket.participant)
        participantID = result.id
        members = [result.id: RoomMember(id: result.id, display: display, isSelf: true)]
        for participant in result.participants {
            members[participant.id] = RoomMember(id: participant.id, display: participant.display ?? "\(participant.id)", isSelf: false)
            mutedStates[participant.id] = participant.muted
        }
        sink.yield(.joined(room: room, participants: participants))

        let iceServers = await signaling.session?.iceServers ?? []
        let peer = try await peers.makePeerConnection(PeerConnectionConfiguration(iceServers: iceServers))
        self.peer = peer
        let sink = self.sink
        return try await withThrowingTaskGroup(of: String?.self) { group in
            group.addTask {
                for await _ in replacements { return "the server replaced this device's room admission" }
                return nil
            }
            // Mixer events from the attach on wait in their stream until here (those of the join among them).
            group.addTask {
                for await event in bridge.events { await self.handle(event) }
                return nil
            }
            group.addTask {
                for await reason in client.sessionEnded { return "\(reason)" }
                return nil
            }
            group.addTask {
                for await event in peer.events {
                    switch event {
                    case .localCandidate(let candidate):
                        try? await client.trickle(bridge.handle, candidate: candidate?.candidate, sdpMid: candidate?.sdpMid,
                                                  sdpMLineIndex: candidate?.sdpMLineIndex)
                    case .remoteAudioStarted:
                        sink.yield(.hearing)
                    default: break
                    }
                }
                return nil
            }
            let offer = try await peer.createOffer(iceRestart: false)
            try await peer.setLocalDescription(offer)
            guard let answer = try await bridge.configure(muted: muted, offer: JSEP(type: offer.type, sdp: offer.sdp)) else {
                throw JanusError.malformed("configure: no SDP answer")
            }
            try await peer.setRemoteDescription(SessionDescription(type: answer.type, sdp: answer.sdp))
            connected()
            // Until a loop reports the loss, or all have ended (the media closed, or cancelled).
            while let outcome = try await group.next() {
                if let lost = outcome {
                    group.cancelAll()
                    return lost
                }
            }
            return nil
        }
    }

    private func handle(_ event: AudioBridgeEvent) async {
        switch event {
        case .joined(_, let participants), .participantsUpdated(_, let participants):
            for participant in participants where participant.id != participantID {
                let member = RoomMember(id: participant.id, display: participant.display ?? "\(participant.id)", isSelf: false)
                let known = members[participant.id]
                if known == nil { sink.yield(.memberJoined(member)) }
                members[participant.id] = member
                if mutedStates[participant.id] ?? false != participant.muted {
                    sink.yield(.muted(member, participant.muted))
                }
                mutedStates[participant.id] = participant.muted
            }
        case .leaving(_, let id):
            // Our own leaving finds no member: only others are in `members`.
            if let member = members.removeValue(forKey: id) { sink.yield(.memberLeft(member)) }
        case .kicked(_, let id?) where id != participantID:
            if let member = members.removeValue(forKey: id) { sink.yield(.memberLeft(member)) }
        case .kicked where rejoining || replacement != nil:
            // The server replacing this device's admission (`rejoinServer`), which joins Janus again.
            kickedWhileRejoining = true
        case .kicked:
            await end("removed from the room")
        case .talking(_, let id, let talking):
            if let member = members[id] { sink.yield(.talking(member, talking)) }
        case .destroyed:
            await end("the room was closed")
        case .webrtcUp:
            sink.yield(.connected)
        case .hangup(let reason):
            if !leaving { logger.notice("Janus hung up the room's media", metadata: ["reason": "\(reason)"]) }
        default:
            break
        }
    }

    private var mutedStates: [Int64: Bool] = [:]

    public func setMuted(_ muted: Bool) async throws {
        self.muted = muted
        await peer?.setMicrophoneMuted(muted)
        try await bridge?.configure(muted: muted)
    }

    /// Leaves Janus (leave, hangup), then the room on the server.
    public func leave() async {
        leaving = true
        // Janus first, while the session's loops still run (they would close the connection as they end).
        if let bridge {
            try? await bridge.leave()
            try? await bridge.hangup()
            try? await bridge.client.destroy()
        }
        running?.cancel()
        await running?.value
        running = nil
        await teardownMedia()
        let room = self.room
        _ = try? await signaling.request { .roomLeave(RoomLeave(id: $0, room: room)) }
        await end("left")
    }

    /// Closes what one connection to Janus opened.
    private func teardownMedia() async {
        participantID = nil
        await peer?.close()
        peer = nil
        bridge = nil
        await client?.close()
        client = nil
    }

    /// Ends the session. Called from a loop of the session's task too (kicked, room destroyed): it
    /// closes the media, which ends the loops, and the task then stops; never awaited here.
    private func end(_ reason: String) async {
        guard !ended else { return }
        ended = true
        leaving = true
        sink.yield(.ended(reason: reason))
        sink.finish()
        let peer = self.peer, bridge = self.bridge, client = self.client
        self.peer = nil
        self.bridge = nil
        self.client = nil
        await peer?.close()
        // Removed by the server or the room closed: our Janus session goes too.
        try? await bridge?.client.destroy()
        await client?.close()
    }

    private var ended = false
}
