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
    private var bridge: AudioBridge?
    private var peer: (any PeerConnection)?
    private var participantID: Int64?
    private var members: [Int64: RoomMember] = [:]
    /// The connection's loops (mixer events, the Janus session's end, the peer's events), children
    /// of one task: cancelled and awaited when the media is torn down.
    private var media: Task<Void, Never>?
    private var muted = false
    private var leaving = false
    private var attempt = 0

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

    /// Joins: `room.join`, then Janus. Throws with a plain message when either refuses.
    public func join() async throws {
        let ack: Ack
        let room = self.room, display = self.display
        do {
            ack = try await signaling.request { .roomJoin(RoomJoin(id: $0, room: room, display: display)) }
        } catch {
            throw RoomError("the server refused to join room \(room): \(error)")
        }
        let joined = try ack.decodeResult(RoomJoinResult.self)
        guard joined.media.mode == "audiobridge", let janus = joined.media.janus else {
            throw RoomError("room \(room) is a \(joined.media.mode) room; voice rooms need AudioBridge (start the server with --janus)")
        }
        do {
            try await connect(janus)
        } catch {
            throw RoomError("cannot join the voice room on Janus at \(janus.url): \(error)")
        }
    }

    private func connect(_ ticket: RoomMedia.Janus) async throws {
        let transport = try await connectJanus(ticket.url)
        let client = JanusClient(transport: transport)
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
        // Mixer events from the attach on wait in their stream until here (those of the join among them).
        let sink = self.sink
        media = Task {
            await withDiscardingTaskGroup { group in
                group.addTask { for await event in bridge.events { await self.handle(event) } }
                group.addTask {
                    for await reason in client.sessionEnded {
                        await self.lost("\(reason)")
                        return
                    }
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
                }
            }
        }
        let offer = try await peer.createOffer(iceRestart: false)
        try await peer.setLocalDescription(offer)
        guard let answer = try await bridge.configure(muted: muted, offer: JSEP(type: offer.type, sdp: offer.sdp)) else {
            throw JanusError.malformed("configure: no SDP answer")
        }
        try await peer.setRemoteDescription(SessionDescription(type: answer.type, sdp: answer.sdp))
        attempt = 0
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
        rejoining?.cancel()
        if let bridge {
            self.bridge = nil
            try? await bridge.leave()
            try? await bridge.hangup()
            try? await bridge.client.destroy()
            await bridge.client.close()
        }
        let room = self.room
        _ = try? await signaling.request { .roomLeave(RoomLeave(id: $0, room: room)) }
        await end("left")
    }

    private func lost(_ reason: String) async {
        guard !leaving, rejoining == nil else { return }
        sink.yield(.reconnecting(reason: reason))
        // Its own task: the one that noticed the loss is among those the teardown cancels.
        rejoining = Task { await self.rejoin() }
    }

    private var rejoining: Task<Void, Never>?

    /// Janus restarted or the connection dropped: join again (the server gives a new token and
    /// creates the room again when Janus lost it), with backoff.
    private func rejoin() async {
        await teardownMedia()
        while !leaving, !Task.isCancelled {
            attempt += 1
            try? await Task.sleep(for: .milliseconds(min(5000, 250 * (1 << min(attempt, 5)))))
            guard !leaving else { break }
            do {
                try await join()
                break
            } catch {
                logger.info("rejoining the room failed; trying again", metadata: ["error": "\(error)"])
                await teardownMedia()
            }
        }
        rejoining = nil
    }

    private func teardownMedia() async {
        let media = self.media
        self.media = nil
        media?.cancel()
        await media?.value
        await peer?.close()
        peer = nil
        if let bridge { await bridge.client.close() }
        bridge = nil
    }

    /// Ends the session. Called from a loop of `media` too (kicked, room destroyed): so the media
    /// is closed first, then its task cancelled, never awaited here.
    private func end(_ reason: String) async {
        sink.yield(.ended(reason: reason))
        sink.finish()
        let media = self.media, peer = self.peer, bridge = self.bridge
        self.media = nil
        self.peer = nil
        self.bridge = nil
        await peer?.close()
        // Removed by the server or the room closed: our Janus session goes too.
        if let bridge {
            try? await bridge.client.destroy()
            await bridge.client.close()
        }
        media?.cancel()
    }
}
