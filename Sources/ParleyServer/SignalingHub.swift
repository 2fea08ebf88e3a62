import Foundation
import Logging
import ParleyProtocol

/// The heart of the signaling server: sessions, calls and rooms of protocol v1.
///
/// The hub knows nothing of WebSockets. A transport registers each connection (`connect`), hands
/// it the frames it reads (`receive`, `refuse`), and reports its end (`disconnected`); the hub
/// answers through each connection's `outbound` stream. Every timeout (hello, heartbeat, token
/// expiry, resume window, ring timeout) is checked by `sweep()`, which `run()` calls on the
/// injected clock, so tests drive time by hand.
public actor SignalingHub<C: Clock> where C.Duration == Duration {
    public nonisolated let configuration: ServerConfiguration
    public nonisolated let clock: C
    private nonisolated let origin: C.Instant
    private let store: any SignalingStore
    /// Writes the hub's calls to the store: a service the server runs beside the hub.
    public nonisolated let records: CallRecordWriter
    private let metrics: ServerMetrics
    private let logger: Logger
    private let wallClock: @Sendable () -> Int64
    private let pushes: AsyncStream<Push>.Continuation?
    private let codec = WireCodec()

    private struct ConnectionEntry {
        var connection: Connection
        var connectedAt: Duration
        var session: DeviceKey?
    }

    private var connections: [UInt64: ConnectionEntry] = [:]
    private var sessions: SessionTable
    private var calls = CallTable()
    /// Ringing calls' devices woken by a VoIP push: told of the call by an alert if it ends unanswered.
    private var pushedDevices: [CallID: [DeviceRecord]] = [:]
    private var rooms = RoomTable()
    /// With Janus configured, every room is an AudioBridge room provisioned here.
    private let audioBridge: AudioBridgeRooms?
    private var shuttingDown = false

    /// The other nodes of the deployment, if there are any (`ClusterLink`).
    private let cluster: (any ClusterLink)?
    /// Which node holds which device and runs which call, as heard, and what this node waits for
    /// from the others (`ClusterRoutes`).
    private var routes = ClusterRoutes()
    /// Requests forwarded to the nodes that run their calls, waiting for the answer, by the id of
    /// their wait in `routes`; each is failed as `unavailable` at its deadline (`sweep`).
    private var forwarded: [UInt64: CheckedContinuation<Result<AckResult, ErrorMessage>, Never>] = [:]
    /// How long a node waits for another to answer a forwarded request.
    static var forwardTimeout: Duration { .seconds(5) }
    /// Hellos waiting for the node that held their session to hand it over (`fetchSession`), by
    /// the id of their wait in `routes`; each goes on without it at its deadline (`sweep`).
    private var handovers: [UInt64: CheckedContinuation<Void, Never>] = [:]
    /// Whether `run()` has stopped sweeping: the waits above are ended then, and none starts after
    /// (no deadline would end it), so nothing of the hub's waits for another node as it stops.
    private var waitsEnded = false
    /// How long a resume waits for another node to hand its session over.
    static var handoverTimeout: Duration { .seconds(2) }
    /// Janus admissions under way, by device and room, and the leaves waiting for them: a
    /// `room.leave` sent while its join still waits for Janus leaves once the join is done (else it
    /// found the device in no room, and the join then listed it).
    private var admitting: [DeviceKey: [RoomID: (count: Int, leaves: [CheckedContinuation<Void, Never>])]] = [:]
    /// Work the hub hands off so as not to wait for it (Janus releasing a token): run as children of
    /// `run()`, so none outlives the hub.
    private let jobs = AsyncStream<@Sendable () async -> Void>.makeStream()

    /// - Parameters:
    ///   - wallClock: Unix milliseconds, for call records and expiry times on the wire.
    ///   - pushes: where pushes for offline devices go (nil: none are sent).
    ///   - cluster: the other nodes sharing the store, if any.
    public init(configuration: ServerConfiguration, store: any SignalingStore, metrics: ServerMetrics = ServerMetrics(),
                clock: C, logger: Logger, pushes: AsyncStream<Push>.Continuation? = nil, cluster: (any ClusterLink)? = nil,
                wallClock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }) {
        self.configuration = configuration
        self.store = store
        self.records = CallRecordWriter(store: store, logger: logger)
        self.metrics = metrics
        self.clock = clock
        self.origin = clock.now
        self.logger = logger
        self.pushes = pushes
        self.wallClock = wallClock
        self.audioBridge = configuration.janus.map { AudioBridgeRooms(settings: $0, logger: logger) }
        self.cluster = cluster
        self.sessions = SessionTable(bufferLimit: configuration.limits.resumeBufferFrames,
                                     answerLimit: configuration.limits.rememberedRequests)
    }

    /// The hub's monotonic time: the duration since it was created.
    public nonisolated func now() -> Duration { origin.duration(to: clock.now) }

    /// Runs the timeouts, the work handed off, and hears the other nodes, until cancelled.
    public func run(interval: Duration = .seconds(1)) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.runHandedOffWork() }
            if let cluster {
                group.addTask { await self.hearNodes(cluster) }
                group.addTask { for await node in cluster.departures { await self.nodeLeft(node) } }
            }
            while !Task.isCancelled {
                do { try await clock.sleep(for: interval) } catch { break }
                sweep()
            }
            // Before the children are waited for: work handed off (a device joining a room again
            // where it runs now) may wait for another node's answer, which only a sweep (stopped
            // now) or this ends.
            waitsEnded = true
            endWaits(at: nil)
            group.cancelAll()
        }
        // Admissions handed off and never run: the leaves waiting for them are answered.
        for leaves in admitting.values.flatMap({ $0.values.map(\.leaves) }) { for leave in leaves { leave.resume() } }
        admitting = [:]
    }

    /// Hears what the other nodes send, in order, until cancelled. On the hub's own executor: the
    /// loop waits for the next message without leaving it, and hears it without a hop.
    ///
    /// A request may wait on the store or Janus: the replies and deliveries behind it must not, so
    /// requests that want an answer (and a node's leaving) run as children of their own. A request
    /// sent on unanswered runs here, in its place: the next may come from the same device before it
    /// has run (its node acknowledged it), and must not overtake it. It waits on nothing but,
    /// rarely, the store (a call no longer in memory).
    private func hearNodes(_ cluster: any ClusterLink) async {
        await withDiscardingTaskGroup { requests in
            for await message in cluster.messages {
                switch message {
                case .request(let id, _, _, _) where id == NodeMessage.unanswered: await hear(message)
                case .request, .left: requests.addTask { await self.hear(message) }
                default: await hear(message)
                }
            }
        }
    }

    /// Runs the work the hub and its rooms hand off, until cancelled: part of `run()`, and on its own
    /// for a hub driven by hand (tests on a manual clock, which sweep themselves).
    public func runHandedOffWork() async {
        await withDiscardingTaskGroup { group in
            if let audioBridge { group.addTask { await audioBridge.run() } }
            for await job in jobs.stream { group.addTask { await job() } }
        }
    }

    /// Hands `job` to `run()`, which runs it beside the hub's other work.
    private func hand(_ job: @escaping @Sendable () async -> Void) {
        jobs.continuation.yield(job)
    }

    /// Takes the deployment's room key (`JanusSettings.roomKey`), which the server reads from the
    /// store as it starts, before any connection.
    public func useRoomKey(_ roomKey: [UInt8]) async {
        await audioBridge?.useDeploymentKey(roomKey)
    }

    // MARK: Restart

    /// Takes over the calls a previous process left unfinished (`SignalingStore.unfinishedCalls()`),
    /// before any connection: they go on as if every party had just disconnected. Each party's
    /// device is held as a session without a connection for the resume window; a device that
    /// connects again gets `resumed: false`, asks `call.state` and hears `active`; one that does not
    /// come back ends its calls with `connection-lost` when the window closes. A ringing call keeps
    /// its expiry, and the callee's devices get `call.incoming` when they connect.
    public func restore(_ unfinished: [StoredCall]) {
        for stored in unfinished where calls[stored.record.call] == nil {
            let call = HubCall(restoring: stored)
            calls.insert(call)
            metrics.callsRestored.increment()
            if call.phase == .active { metrics.activeCalls.increment() } else { metrics.ringingCalls.increment() }
            for key in call.participants where routes.holder(of: key) == nil && sessions.hold(key, now: now()) {
                metrics.sessions.increment()
            }
        }
        if !unfinished.isEmpty {
            logger.notice("restored calls left unfinished by the previous run", metadata: ["calls.count": "\(unfinished.count)"])
        }
    }

    // MARK: Connections

    public func connect(_ connection: Connection) {
        guard !shuttingDown else {
            connection.outbound.write(.close(.goingAway, reason: "the server is shutting down"))
            connection.outbound.finish()
            return
        }
        connections[connection.id] = ConnectionEntry(connection: connection, connectedAt: now())
        metrics.connections.increment()
    }

    /// The transport's connection ended (closed by either side, or failed).
    public func disconnected(_ connectionID: UInt64) {
        detach(connectionID)
    }

    /// Closes a connection with a protocol close code. The session, if any, is held for resume.
    public func close(_ connectionID: UInt64, code: CloseCode, reason: String) {
        guard let entry = connections[connectionID] else { return }
        logger.debug("closing connection", metadata: ["connection.id": "\(connectionID)", "close.code": "\(code.rawValue)"])
        entry.connection.outbound.write(.close(code, reason: reason))
        entry.connection.outbound.finish()
        detach(connectionID)
    }

    private func detach(_ connectionID: UInt64) {
        guard let entry = connections.removeValue(forKey: connectionID) else { return }
        entry.connection.outbound.finish()
        metrics.connections.decrement()
        if let key = entry.session { sessions.detach(key, connection: connectionID, now: now()) }
    }

    // MARK: Frames in

    /// A frame the transport could not accept: unreadable, or over the rate limit. Answers it with
    /// `error` (with `re` when the id is known); nothing is executed or remembered.
    public func refuse(_ connectionID: UInt64, requestID: String?, code: ErrorCode, message: String) {
        guard let entry = connections[connectionID] else { return }
        metrics.framesIn.increment()
        send(.error(ErrorMessage(re: requestID, code: code, message: message)), on: entry)
    }

    /// A request frame of a connection, decoded. `text`: the frame as the client sent it, which a
    /// request forwarded to another node carries instead of being encoded again.
    public func receive(_ connectionID: UInt64, _ message: ClientMessage, text: String? = nil) async {
        guard let entry = connections[connectionID] else { return }
        metrics.framesIn.increment()
        // The session's id, not a copy of it: a copy held while the table's session changes would
        // make every change copy its resume buffer and remembered answers.
        guard let key = entry.session, let sessionID = sessions.id(of: key) else {
            if case .hello(let hello) = message {
                await handleHello(hello, on: entry)
            } else {
                send(.error(ErrorMessage(re: message.requestID, code: .badRequest, message: "the first frame must be hello")), on: entry)
            }
            return
        }
        switch message {
        case .hello(let hello):
            send(.error(ErrorMessage(re: hello.id, code: .badRequest, message: "this connection has already said hello")), to: key)
        case .ack(let ack):
            sessions.modify(key) { $0.acknowledge(through: ack.seq) }
        default:
            guard let requestID = message.requestID else { return }
            // Who asks, as the session says when the request comes (it may expire or change meanwhile).
            let sender: Party
            switch sessions.begin(requestID, in: key) {
            case .answered(let answer)?:
                send(answer, to: key)
                return
            case .running?, nil:
                // Answered when the work in flight finishes (a repeated id is not run twice).
                return
            case .started(let name, let address)?:
                sender = Party(user: key.user, device: key.device, name: name, address: address)
            }
            if case .roomJoin(let join) = message, let audioBridge, await runsHere(join.room) {
                // In flight until Janus answers.
                beginAudioBridgeJoin(join, requestID: requestID, in: sessionID, of: key, bridge: audioBridge)
                return
            }
            let answer: ServerMessage
            do throws(ErrorMessage) {
                // Requests that read the store suspend here, and frames of other connections run
                // meanwhile: what they read about calls is checked again after each read.
                answer = .ack(Ack(re: requestID, result: try await execute(message, requestID: requestID, from: sender, text: text)))
            } catch {
                answer = .error(ErrorMessage(re: requestID, code: error.code, message: error.message))
            }
            respond(to: requestID, with: answer, in: sessionID, of: key)
        }
    }

    /// Ends a request: remembers its answer and sends it, in the session the request came in (a
    /// session that expired or was replaced while the request ran does not get it).
    private func respond(to requestID: String, with answer: ServerMessage, in sessionID: String, of key: DeviceKey) {
        guard let frame = sessions.answer(requestID, with: answer, ifSession: sessionID, in: key, { seq in
            encode(ServerFrame(seq: seq, message: answer))
        }) else { return }
        if case .error(let error) = answer { metrics.error(error.code) }
        write(frame, to: key)
    }

    // MARK: Session

    private func handleHello(_ hello: Hello, on entry: ConnectionEntry) async {
        let identity = entry.connection.identity
        let key = DeviceKey(user: identity.user, device: hello.device)
        if let resume = hello.resume, let cluster, !sessions.contains(key), !shuttingDown {
            await fetchSession(resume.session, of: key, through: cluster)
            // The connection may have ended (or the hub begun to stop), or said hello again, while
            // the other node answered: then this hello comes to nothing.
            guard let current = connections[entry.connection.id], current.session == nil, !shuttingDown else { return }
        }
        let outcome = sessions.hello(key, resume: hello.resume, on: entry.connection.id, devicesPerUser: configuration.limits.devicesPerUser)
        guard case .welcomed(let sessionID, let resumed, let created, let replaced, let replay) = outcome else {
            if case .refused(let devices) = outcome {
                let refusal = ErrorMessage(re: hello.id, code: .forbidden,
                                           message: "\(key.user) has \(devices) devices connected or resumable, the most one user may have")
                entry.connection.outbound.write(.text(encode(ServerFrame(seq: nil, message: .error(refusal)))))
                metrics.framesOut.increment()
                metrics.error(refusal.code)
                close(entry.connection.id, code: .policy, reason: "too many devices for one user")
            }
            return
        }
        if let replaced { close(replaced, code: .replaced, reason: "replaced by a newer connection of the same device") }
        if created { metrics.sessions.increment() }
        sessions.modify(key) { session in
            session.name = identity.name
            session.address = entry.connection.address
            if let platform = hello.client?.platform, Platform.known.contains(platform) { session.platform = platform }
        }
        connections[entry.connection.id]?.session = key

        let welcome = Welcome(re: hello.id, session: sessionID, user: key.user, device: key.device, resumed: resumed,
                              heartbeat: configuration.heartbeat,
                              iceServers: configuration.iceServers.iceServers(for: key.user))
        entry.connection.outbound.write(.text(encode(ServerFrame(seq: nil, message: .welcome(welcome)))))
        metrics.framesOut.increment()
        logger.debug("session started", metadata: ["session.id": "\(sessionID)", "peer.device": "\(key)", "session.resumed": "\(resumed)"])
        if let cluster, !resumed {
            // A resumed session was here already (or was handed over, and told). A new one is news for
            // the node that held the device before and for nodes ringing its user: `holds` tells them (`claimed`).
            routes.startedHere(key)
            cluster.holds(key, true)
        }

        for frame in replay {
            entry.connection.outbound.replay(frame.text)
            metrics.framesOut.increment()
        }
        if !resumed {
            // A device that connects while an invite to its user still rings gets it at once.
            for call in calls.ring(key) { send(.callIncoming(call.incoming), to: key) }
        }
    }

    /// A device resumes here a session that another node holds (a load balancer sent its reconnect
    /// here): asks that node, as the directory names it, to hand the session over, and waits for it
    /// at most `handoverTimeout`. The session arrives, and is held here, in `hear(.handedOver)`:
    /// before any frame the old node sends on for the device. Without it the hello gets a new session.
    private func fetchSession(_ session: String, of key: DeviceKey, through cluster: any ClusterLink) async {
        let holders: [DeviceKey: NodeID]
        do {
            holders = try await cluster.remoteDevices(of: key.user)
        } catch {
            // The directory did not answer (the database is away): the device gets a new session.
            logger.warning("could not ask which node holds a session; starting a new one",
                           metadata: ["peer.device": "\(key)", "session.id": "\(session)", "error": "\(error)"])
            return
        }
        guard let holder = holders[key], holder != cluster.node, !waitsEnded else { return }
        let id = routes.wait(.handover, on: holder, until: now() + Self.handoverTimeout)
        await withCheckedContinuation { continuation in
            handovers[id] = continuation
            cluster.send(.handover(id: id, key: key, session: session, from: cluster.node), to: holder)
        }
    }

    private func expire(_ key: DeviceKey) {
        guard let session = sessions.remove(key) else { return }
        routes.sessionGone(key)
        metrics.sessions.decrement()
        logger.debug("session expired", metadata: ["session.id": "\(session.id)", "peer.device": "\(key)"])
        if let cluster {
            cluster.holds(key, false)
            cluster.send(.released(key, by: cluster.node), to: nil)
        }
        for callID in calls.live(of: key.user) {
            update(callID) { call, now in call.connectionLost(key, now: now) }
        }
        for room in rooms.rooms(of: key) {
            leaveRoom(room, key: key)
        }
    }

    // MARK: Requests

    /// Runs a request of a session here, or forwards it to the node that runs its call or room.
    private func execute(_ message: ClientMessage, requestID: String, from sender: Party, text: String? = nil) async throws(ErrorMessage) -> AckResult {
        let key = sender.key
        // An invite asks after its call's node only if its id is in the store (`startCall`): a new
        // call, which nearly every invite is, costs the directory nothing.
        if cluster != nil, let callID = message.aboutCall, calls[callID] == nil, let runner = await runner(of: callID, for: key) {
            do {
                return try await forward(message, about: callID, from: key, to: runner, frame: text)
            } catch where error.code == .unavailable {
                // The owner went silent: if it is gone, the call is taken over here (or by a third node).
                routes.forgetOwner(of: callID)
                guard calls[callID] == nil else { return try await execute(message, from: sender) }
                guard let next = await owner(of: callID) else { return try await execute(message, from: sender) }
                guard next != runner else { throw error }
                return try await forward(message, about: callID, from: key, to: next, frame: text)
            }
        }
        if cluster != nil, let room = message.aboutRoom {
            if case .roomLeave = message { routes.left(room, by: key) }
            if !(await runsHere(room, claiming: message.isRoomJoin)), let runner = try? await cluster?.roomOwner(room, claim: false) {
                return try await forwardRoomRequest(message, about: room, from: key, to: runner, frame: text)
            }
            if case .roomJoin = message { routes.left(room, by: key) }
        }
        return try await execute(message, from: sender)
    }

    /// A room request forwarded to the node that runs the room. A join is remembered as the
    /// device's (made again there if that node goes away: `rejoin`) before it goes, so a leave
    /// handled meanwhile undoes it; its ack names the Janus participant to keep then.
    private func forwardRoomRequest(_ message: ClientMessage, about room: RoomID, from key: DeviceKey, to runner: NodeID,
                                    frame text: String?) async throws(ErrorMessage) -> AckResult {
        guard case .roomJoin(let join) = message, sessions.contains(key) else {
            return try await forward(message, from: key, to: runner, frame: text)
        }
        routes.joined(join, by: key, on: runner)
        do {
            let result = try await forward(message, from: key, to: runner, frame: text)
            routes.admitted(try? result.decoded(as: RoomJoinResult.self).media.janus?.participant, to: room, by: key, on: runner)
            return result
        } catch {
            routes.left(room, by: key, on: runner)
            throw error
        }
    }

    private func execute(_ message: ClientMessage, from sender: Party) async throws(ErrorMessage) -> AckResult {
        let key = sender.key
        switch message {
        case .ping:
            return .done
        case .callInvite(let invite):
            return try await startCall(invite, from: sender)
        case .callRinging(let request):
            try await update(request.call, by: key) { call, _ throws(ErrorMessage) in try call.ringing(from: key, early: request.early == true) }
            return .done
        case .callAccept(let request):
            try await update(request.call, by: key) { call, now throws(ErrorMessage) in try call.accept(from: key, now: now) }
            return .done
        case .callDecline(let decline):
            try await update(decline.call, by: key) { call, now throws(ErrorMessage) in
                try call.decline(from: key, reason: decline.reason ?? .declined, now: now)
            }
            return .done
        case .callHangup(let hangup):
            try await update(hangup.call, by: key) { call, now throws(ErrorMessage) in
                try call.hangup(from: key, detail: hangup.reason, now: now)
            }
            return .done
        case .callSignal(let signal):
            try await update(signal.call, by: key) { call, _ throws(ErrorMessage) in
                try call.signal(from: key, device: signal.device) { from in
                    .callSignal(CallSignalled(call: signal.call, from: from, signal: signal.signal))
                }
            }
            return .done
        case .callUpdate(let change) where change.recording != nil:
            return try await recordingStep(change, from: key)
        case .callUpdate(let change):
            try await update(change.call, by: key) { call, _ throws(ErrorMessage) in
                try call.relay(from: key) { from in
                    .callUpdated(CallUpdated(call: change.call, from: from, muted: change.muted, held: change.held, video: change.video))
                }
            }
            return .done
        case .callReport(let report):
            try await self.report(report, from: key)
            return .done
        case .callState(let request):
            return try await callState(request.call, asker: key.user)
        case .roomJoin(let join):
            return try await joinRoom(join, key: key)
        case .roomLeave(let leave):
            if !rooms.contains(key, in: leave.room) { await admissionsDone(to: leave.room, of: key) }
            guard rooms.contains(key, in: leave.room) else {
                throw ErrorMessage(code: .notInRoom, message: "this device is not in room \(leave.room)")
            }
            // Acknowledged once Janus no longer admits the device's token: a join with it right
            // after the ack is refused. Janus out of reach: the device has left all the same, and
            // the ack says the revocation is still to come (the server keeps trying).
            let revoked = await leaveAndRevoke(leave.room, key: key)
            return revoked ? .done : .roomLeave(RoomLeaveResult(revocationPending: true))
        case .roomSignal(let signal):
            let delivery = try rooms.signal(signal, from: key)
            deliver(delivery.message, to: delivery.to)
            return .done
        case .hello, .ack:
            return .done
        }
    }

    private func startCall(_ invite: CallInvite, from sender: Party) async throws(ErrorMessage) -> AckResult {
        let caller = sender.key
        if let result = try answerToKnownCall(invite, from: caller) { return result }
        guard invite.to != caller.user else { throw ErrorMessage(code: .badRequest, message: "a user cannot call themselves") }
        if invite.metadata?.holdsNUL == true {
            throw ErrorMessage(code: .badRequest, message: "metadata may not hold U+0000 in a string or a key")
        }
        let now = wallClock()
        let expiresAt = now + Int64(configuration.ringTimeout.components.seconds * 1000)
            + configuration.ringTimeout.components.attoseconds / 1_000_000_000_000_000
        // On a LAN the callee is shown where the call comes from: the name is the caller's own choice.
        let address = configuration.lan != nil ? sender.address : nil
        func newCall(createdAt: Int64) -> HubCall {
            HubCall(id: invite.call, caller: Party(user: caller.user, device: caller.device, name: sender.name, address: address),
                    callee: invite.to, media: invite.media, metadata: invite.metadata, createdAt: createdAt, expiresAt: expiresAt)
        }
        var call = newCall(createdAt: now)
        // With several nodes the call is in the store before any other node hears of it (a device of
        // the callee's that connects to another node finds it ringing there), and its id is claimed
        // with what the invite reads, in one statement.
        let claim = try await self.claim(call)
        if claim?.taken ?? true, let record = try await storedCall(invite.call) {
            // The same invite may have been sent again while the store was read, and claimed the id.
            if let result = try answerToKnownCall(invite, from: caller) { return result }
            // An invite sent again after its caller moved to this node: the node that runs the call answers it.
            if cluster != nil, record.endedAt == nil, record.caller == caller.user, calls[invite.call] == nil,
               let runner = await owner(of: invite.call, adopting: false) {
                return try await forward(.callInvite(invite), from: caller, to: runner)
            }
            if try await isLostClaim(record, of: invite, from: caller) {
                // It rings as the call the store has, which started then.
                call = newCall(createdAt: record.createdAt)
            } else {
                // The same invite may have been sent again meanwhile, and rung.
                if let result = try answerToKnownCall(invite, from: caller) { return result }
                guard record.caller == caller.user || record.callee == caller.user else {
                    throw ErrorMessage(code: .callNotFound, message: "no such call")
                }
                if record.caller == caller.user, record.endedAt != nil {
                    throw ErrorMessage(code: .callEnded, message: "call \(invite.call) has ended")
                }
                throw ErrorMessage(code: .badRequest, message: "call id \(invite.call) is already in use")
            }
        }
        // The same id may have been invited while the store was read.
        if let result = try answerToKnownCall(invite, from: caller) { return result }
        // A LAN listener is never on PostgreSQL (`ServerConfiguration.validate`): nothing was claimed.
        if let lan = configuration.lan {
            guard invite.to == lan.host else {
                throw ErrorMessage(code: .forbidden, message: "this is \(lan.host)'s device on a local network: it takes calls to \(lan.host) only")
            }
            // Strangers on the network do not get to ring it over and over at once.
            if calls.live(of: lan.host).contains(where: { calls[$0]?.phase == .ringing }) {
                throw ErrorMessage(code: .rateLimited, message: "\(lan.host) is being called already; try again in a moment")
            }
        }
        // Devices of the callee on other nodes ring too.
        for (key, node) in claim?.held ?? [:] where !sessions.contains(key) { routes.heard(key, isOn: node) }
        let online = sessions.devices(of: invite.to).union(routes.remoteDevices(of: invite.to)).sorted()
        for device in online { call.rang(device) }
        calls.insert(call)
        metrics.callsStarted.increment()
        metrics.ringingCalls.increment()
        if cluster == nil { save(call) }
        for device in online {
            deliver(.callIncoming(call.incoming), to: DeviceKey(user: invite.to, device: device))
        }
        let pushed = await sendPushes(for: invite.call, devices: claim?.devices)
        logger.debug("call invited", metadata: ["call.id": "\(invite.call)", "peer.device": "\(caller)", "call.devices": "\(online.count)"])
        return .callInvite(CallInviteResult(call: invite.call, devices: online.count, pushed: pushed, expiresAt: expiresAt))
    }

    /// The answer to an invite whose call id the hub holds already: the same invite again from the
    /// device that made it (a retry whose answer was lost: a server restart forgets request ids) is
    /// answered as the first was and rings no one again; any other use of the id is refused. Nil for
    /// an id the hub does not hold.
    private func answerToKnownCall(_ invite: CallInvite, from caller: DeviceKey) throws(ErrorMessage) -> AckResult? {
        guard let existing = calls[invite.call] else { return nil }
        guard existing.involves(caller.user) else { throw ErrorMessage(code: .callNotFound, message: "no such call") }
        if existing.caller.user == caller.user, existing.caller.device == caller.device, existing.callee == invite.to,
           existing.phase != .ended {
            return .callInvite(CallInviteResult(call: invite.call, devices: existing.rungDevices.count, pushed: 0,
                                                expiresAt: existing.expiresAt))
        }
        if existing.phase == .ended, existing.caller.user == caller.user {
            throw ErrorMessage(code: .callEnded, message: "call \(invite.call) has ended")
        }
        throw ErrorMessage(code: .badRequest, message: "call id \(invite.call) is already in use")
    }

    /// With several nodes, a new call stored unless its id is taken, with what its invite reads
    /// (`ClusterDirectory.claim`); nil on a node of its own, which reads each when it needs it and
    /// hands the call to the record writer.
    private func claim(_ call: HubCall) async throws(ErrorMessage) -> InviteClaim? {
        guard let cluster else { return nil }
        do {
            return try await cluster.claim(call.stored.owned(by: cluster.node), store: store)
        } catch {
            logger.log(level: Task.isCancelled ? .debug : .error, "a new call could not be stored",
                       metadata: ["call.id": "\(call.id)", "error": "\(error)"])
            throw ErrorMessage(code: .unavailable, message: "the call records cannot be read right now; try again")
        }
    }

    /// Whether a stored call is this invite's own, claimed by this node although the invite was
    /// refused: the claim went in and its answer was lost (`unavailable`, "try again"). It is the
    /// same device's invite of the same callee with the same media, unanswered and unfinished, held
    /// by no node's memory, and the directory says this node runs it. Then the invite sent again
    /// rings now.
    private func isLostClaim(_ record: CallRecord, of invite: CallInvite, from caller: DeviceKey) async throws(ErrorMessage) -> Bool {
        guard let cluster, calls[invite.call] == nil, record.caller == caller.user, record.callerDevice == caller.device,
              record.callee == invite.to, record.media == invite.media, record.answeredAt == nil, record.endedAt == nil
        else { return false }
        do {
            return try await cluster.owner(of: invite.call) == cluster.node && calls[invite.call] == nil
        } catch {
            logger.error("could not find the node of a call", metadata: ["call.id": "\(invite.call)", "error": "\(error)"])
            throw ErrorMessage(code: .unavailable, message: "the call records cannot be read right now; try again")
        }
    }

    /// VoIP pushes go to the callee's devices with a token and no live connection, while the call
    /// still rings once they are read (`devices`: read with the invite; nil: read now).
    private func sendPushes(for callID: CallID, devices read: [DeviceRecord]?) async -> Int {
        guard let pushes, let callee = calls[callID]?.callee else { return 0 }
        let devices: [DeviceRecord]
        if let read {
            devices = read
        } else {
            do {
                devices = try await store.devices(of: callee)
            } catch {
                logger.error("could not read devices for push", metadata: ["error": "\(error)"])
                return 0
            }
        }
        guard let call = calls[callID], call.phase == .ringing else { return 0 }
        var sent: [DeviceRecord] = []
        for device in devices {
            guard let voip = device.voip else { continue }
            let key = DeviceKey(user: device.user, device: device.device)
            if sessions.isConnected(key) { continue }
            if routes.holder(of: key) != nil { continue }
            let payload = VoIPPushPayload(parley: .init(call: call.id, from: .init(user: call.caller.user, name: call.caller.name),
                                                        media: call.media, expiresAt: call.expiresAt))
            let push = Push(user: device.user, device: device.device, registration: voip, content: .incomingCall(payload))
            pushes.yield(push)
            sent.append(device)
        }
        if !sent.isEmpty { pushedDevices[call.id] = sent }
        return sent.count
    }

    /// A call that woke devices by push ended: if nobody answered, each of them with an alert token
    /// gets a missed-call alert (an ordinary push to the app's notification token: a VoIP token
    /// cannot take one, and iOS would have to show a call for a VoIP push).
    private func sendMissedCallAlerts(for call: HubCall) {
        guard let woken = pushedDevices.removeValue(forKey: call.id), let pushes else { return }
        guard call.endReason == .noAnswer || call.endReason == .cancelled else { return }
        let alert = MissedCallAlert(call: call.id, from: .init(user: call.caller.user, name: call.caller.name), at: wallClock())
        for device in woken {
            guard let alerts = device.alerts else { continue }
            pushes.yield(Push(user: device.user, device: device.device, registration: alerts, content: .missedCall(alert)))
        }
    }

    /// Runs one event on a call and performs what it says: deliveries, the record, the end.
    private func update(_ callID: CallID, by sender: DeviceKey,
                        _ event: (inout HubCall, Int64) throws(ErrorMessage) -> [Delivery]) async throws(ErrorMessage) {
        guard calls[callID] != nil else {
            // Not in memory: an old call (its record says whether it ended) or no call at all.
            let record = try await storedCall(callID)
            if calls[callID] != nil {
                // Taken over while the store was read.
                try update(callID, event)
                return
            }
            if let record, record.caller == sender.user || record.callee == sender.user {
                guard record.endedAt != nil else {
                    // With several nodes: a call whose node could not be told, or is being replaced.
                    throw ErrorMessage(code: .unavailable, message: "the call's server cannot be reached right now; try again")
                }
                throw ErrorMessage(code: .callEnded, message: "the call has ended (\(record.reason?.rawValue ?? "ended"))")
            }
            throw ErrorMessage(code: .callNotFound, message: "no such call")
        }
        try update(callID, event)
    }

    private func update(_ callID: CallID,
                        _ event: (inout HubCall, Int64) throws(ErrorMessage) -> [Delivery]) throws(ErrorMessage) {
        guard let (deliveries, transition) = try calls.apply(callID, at: now(), wallClock: wallClock(), event) else { return }
        for delivery in deliveries { deliver(delivery.message, to: delivery.to) }
        guard let transition else { return }
        let call = transition.call
        save(call)
        if transition.from == .ringing { metrics.ringingCalls.decrement() }
        if call.phase == .active { metrics.activeCalls.increment() }
        if call.phase == .ended {
            if transition.from == .active { metrics.activeCalls.decrement() }
            sendMissedCallAlerts(for: call)
            if let reason = call.endReason { metrics.callEnded(reason) }
            logger.debug("call ended", metadata: ["call.id": "\(callID)", "call.reason": "\(call.endReason?.rawValue ?? "")"])
        }
    }

    private func update(_ callID: CallID, _ event: (inout HubCall, Int64) -> [Delivery]) {
        try? update(callID) { (call: inout HubCall, now: Int64) throws(ErrorMessage) in event(&call, now) }
    }

    private func report(_ report: CallReport, from sender: DeviceKey) async throws(ErrorMessage) {
        let window = Int64(configuration.endedCallRetention.components.seconds * 1000)
        if calls[report.call] != nil {
            try await update(report.call, by: sender) { call, now throws(ErrorMessage) in
                try call.report(report.quality, from: sender, now: now, window: window)
                return []
            }
            if let call = calls[report.call] { save(call) }
            return
        }
        guard var record = try await storedCall(report.call), record.caller == sender.user || record.callee == sender.user else {
            throw ErrorMessage(code: .callNotFound, message: "no such call")
        }
        guard let endedAt = record.endedAt, wallClock() - endedAt <= window else {
            throw ErrorMessage(code: .callEnded, message: "the call ended too long ago to report on")
        }
        record.quality = report.quality
        // Old calls keep the expiry and caller name they were stored with (those columns are set once).
        records.save(StoredCall(record: record, expiresAt: record.createdAt))
    }

    /// A step of recording with consent; its record is saved at once (who consented, and when).
    private func recordingStep(_ change: CallUpdate, from sender: DeviceKey) async throws(ErrorMessage) -> AckResult {
        let callID = change.call
        var state = RecordingState.off
        try await update(callID, by: sender) { call, now throws(ErrorMessage) in
            // Outsiders learn nothing, not even that the frame was malformed.
            guard call.involves(sender.user) else { throw ErrorMessage(code: .callNotFound, message: "no such call") }
            guard change.muted == nil, change.held == nil, change.video == nil, let step = change.recording else {
                throw ErrorMessage(code: .badRequest, message: "a recording step goes in a call.update of its own")
            }
            let (after, deliveries) = try call.recordingStep(step, from: sender, now: now)
            state = after
            return deliveries
        }
        if let call = calls[callID] { save(call) }
        return .recording(RecordingStepResult(recording: state))
    }

    private func callState(_ callID: CallID, asker: UserID) async throws(ErrorMessage) -> AckResult {
        let result: CallStateResult
        if let call = calls[callID] {
            guard call.involves(asker) else { throw ErrorMessage(code: .callNotFound, message: "no such call") }
            result = CallStateResult(call: callID, state: call.phase, reason: call.endReason,
                                     recording: call.phase == .ended ? nil : call.recordingState)
        } else if let record = try await storedCall(callID), record.caller == asker || record.callee == asker {
            result = CallStateResult(call: callID, state: record.endedAt == nil ? .active : .ended, reason: record.reason)
        } else {
            throw ErrorMessage(code: .callNotFound, message: "no such call")
        }
        return .callState(result)
    }

    /// A call's record, for a call not in memory. A store that cannot be read answers `unavailable`
    /// (the client retries), never "no such call": an error is not an absence.
    private func storedCall(_ id: CallID) async throws(ErrorMessage) -> CallRecord? {
        do {
            return try await store.call(id)
        } catch {
            // A forwarded request cancelled as the node stops is not a store failure worth an alarm.
            logger.log(level: Task.isCancelled ? .debug : .error, "a call record could not be read",
                       metadata: ["call.id": "\(id)", "error": "\(error)"])
            throw ErrorMessage(code: .unavailable, message: "the call records cannot be read right now; try again")
        }
    }

    /// Returns once every call change so far is in the store.
    public func flushRecords() async {
        await records.flush()
    }

    // MARK: Rooms

    /// `room.join` run to its end before answering: a mesh room's, or an AudioBridge room's for a
    /// device on another node (a device's own join here goes through `beginAudioBridgeJoin`).
    private func joinRoom(_ join: RoomJoin, key: DeviceKey) async throws(ErrorMessage) -> AckResult {
        guard let audioBridge else {
            try checkJoin(join, key: key, limit: configuration.meshRoomLimit)
            return .roomJoin(RoomJoinResult(room: join.room, participants: admit(join, key: key), media: .mesh))
        }
        try checkJoin(join, key: key, limit: configuration.janus?.roomLimit ?? 0)
        admissionBegins(to: join.room, of: key)
        defer { admissionEnds(to: join.room, of: key) }
        let janus: RoomMedia.Janus
        do { janus = try await audioBridge.admit(room: join.room, device: key, keeping: join.participant) } catch {
            logger.warning("AudioBridge admission failed", metadata: ["room": "\(join.room)", "error": "\(error)"])
            throw ErrorMessage(code: .unavailable, message: "the voice room server (Janus) cannot be reached right now")
        }
        return .roomJoin(RoomJoinResult(room: join.room, participants: admit(join, key: key), media: .audioBridge(janus)))
    }

    /// Rooms need a server (not a LAN listener); then the room table's rules (`RoomTable.checkJoin`).
    private func checkJoin(_ join: RoomJoin, key: DeviceKey, limit: Int) throws(ErrorMessage) {
        if configuration.lan != nil {
            throw ErrorMessage(code: .forbidden, message: "rooms need a Parley server; a device on a local network takes one-to-one calls only")
        }
        try rooms.checkJoin(join.room, by: key, limit: limit)
    }

    /// Puts the device in the room (or updates its display), tells the others it joined; answers
    /// the other members.
    private func admit(_ join: RoomJoin, key: DeviceKey) -> [RoomParticipant] {
        let (others, deliveries) = rooms.admit(join, by: key)
        for delivery in deliveries { deliver(delivery.message, to: delivery.to) }
        return others
    }

    /// The device is gone from the room (its session expired, or it moved to another node): the
    /// others are told now, and Janus stops admitting it in the background.
    private func leaveRoom(_ room: RoomID, key: DeviceKey) {
        guard let isEmpty = removeFromRoom(room, key: key), let audioBridge else { return }
        hand { await audioBridge.release(room: room, device: key, roomIsEmpty: isEmpty) }
    }

    /// `room.leave`: the others are told, then Janus stops admitting the device's token. Answers
    /// whether Janus did; false when it cannot be reached now (it is tried again until it does).
    private func leaveAndRevoke(_ room: RoomID, key: DeviceKey) async -> Bool {
        guard let isEmpty = removeFromRoom(room, key: key), let audioBridge else { return true }
        return await audioBridge.release(room: room, device: key, roomIsEmpty: isEmpty)
    }

    private func admissionBegins(to room: RoomID, of key: DeviceKey) {
        admitting[key, default: [:]][room, default: (0, [])].count += 1
    }

    /// An admission is over, the device in the room if it was admitted: the leaves waiting go on.
    private func admissionEnds(to room: RoomID, of key: DeviceKey) {
        guard var admission = admitting[key]?[room] else { return }
        admission.count -= 1
        admitting[key]?[room] = admission.count > 0 ? (admission.count, []) : nil
        if admitting[key]?.isEmpty == true { admitting[key] = nil }
        for leave in admission.leaves { leave.resume() }
    }

    /// Returns once no admission of the device to the room is under way.
    private func admissionsDone(to room: RoomID, of key: DeviceKey) async {
        while admitting[key]?[room] != nil {
            await withCheckedContinuation { admitting[key]?[room]?.leaves.append($0) }
        }
    }

    /// Takes the device out of the room and tells the others; answers whether the room is empty
    /// now, nil if the device was not in it.
    private func removeFromRoom(_ room: RoomID, key: DeviceKey) -> Bool? {
        guard let (deliveries, isEmpty) = rooms.leave(room, by: key) else { return nil }
        for delivery in deliveries { deliver(delivery.message, to: delivery.to) }
        return isEmpty
    }

    /// `room.join` with Janus: checked here, admitted by Janus (which takes round trips), then
    /// answered from `finishAudioBridgeJoin`.
    private func beginAudioBridgeJoin(_ join: RoomJoin, requestID: String, in sessionID: String, of key: DeviceKey,
                                      bridge: AudioBridgeRooms) {
        do throws(ErrorMessage) {
            try checkJoin(join, key: key, limit: configuration.janus?.roomLimit ?? 0)
        } catch {
            let answer = ServerMessage.error(ErrorMessage(re: requestID, code: error.code, message: error.message))
            respond(to: requestID, with: answer, in: sessionID, of: key)
            return
        }
        guard sessions.id(of: key) == sessionID else { return }
        routes.left(join.room, by: key)
        admissionBegins(to: join.room, of: key)
        hand {
            let result: Result<RoomMedia.Janus, any Error>
            do { result = .success(try await bridge.admit(room: join.room, device: key, keeping: join.participant)) } catch { result = .failure(error) }
            await self.finishAudioBridgeJoin(join, requestID: requestID, in: sessionID, of: key, result: result)
        }
    }

    private func finishAudioBridgeJoin(_ join: RoomJoin, requestID: String, in sessionID: String, of key: DeviceKey,
                                       result: Result<RoomMedia.Janus, any Error>) {
        defer { admissionEnds(to: join.room, of: key) }
        guard case .some(.some) = sessions.modify(key, ifSession: sessionID, { $0.inFlight.remove(requestID) }) else {
            // The session expired (or was replaced by a new one) meanwhile: take this admission back,
            // unless the device is in the room after all (it joined before), whose token it now is.
            if case .success(let janus) = result, let audioBridge, !rooms.contains(key, in: join.room) {
                let empty = rooms.members(of: join.room).isEmpty
                hand { await audioBridge.release(room: join.room, device: key, token: janus.token, roomIsEmpty: empty) }
            }
            return
        }
        let answer: ServerMessage
        switch result {
        case .success(let janus):
            let joined = RoomJoinResult(room: join.room, participants: admit(join, key: key), media: .audioBridge(janus))
            answer = .ack(Ack(re: requestID, result: .roomJoin(joined)))
        case .failure(let error):
            logger.warning("AudioBridge admission failed", metadata: ["room": "\(join.room)", "error": "\(error)"])
            answer = .error(ErrorMessage(re: requestID, code: .unavailable, message: "the voice room server (Janus) cannot be reached right now"))
        }
        respond(to: requestID, with: answer, in: sessionID, of: key)
    }

    // MARK: Several nodes

    private func save(_ call: HubCall) {
        records.save(call.stored.owned(by: cluster?.node))
    }

    /// The node that runs a call a device's request is about: the one that rang the device, or
    /// took its accept, while that holds (`ClusterRoutes.node(of:partOf:)`), or as for any call.
    private func runner(of callID: CallID, for key: DeviceKey) async -> NodeID? {
        if let node = routes.node(of: callID, partOf: key) { return node }
        return await owner(of: callID)
    }

    /// The live node that runs a call this node does not hold; nil when none does (the call is
    /// taken over here if it was left unfinished by a node that is gone, then goes on here).
    private func owner(of callID: CallID, adopting: Bool = true) async -> NodeID? {
        guard let cluster else { return nil }
        if let node = routes.owner(of: callID) { return node }
        do {
            if let node = try await cluster.owner(of: callID), node != cluster.node { return node }
        } catch {
            logger.error("could not find the node of a call", metadata: ["call.id": "\(callID)", "error": "\(error)"])
            return nil
        }
        if adopting, calls[callID] == nil { await adopt(callID) }
        return nil
    }

    /// Takes over unfinished calls whose node is gone (one, or all): they go on here as after a
    /// restart. Devices of theirs on other live nodes stay there; the others get the resume window.
    public func adopt(_ callID: CallID? = nil) async {
        guard let cluster else { return }
        do {
            let adopted = try await cluster.adopt(callID).filter { calls[$0.record.call] == nil }
            for user in Set(adopted.flatMap { [$0.record.caller, $0.record.callee] }) {
                for (key, node) in try await cluster.remoteDevices(of: user) where !sessions.contains(key) {
                    routes.heard(key, isOn: node)
                }
            }
            restore(adopted)
        } catch {
            logger.error("could not take over the calls of a node that is gone", metadata: ["error": "\(error)"])
        }
    }

    /// A call's request sent to the node that runs the call: acknowledged here and sent on
    /// unanswered where that node could refuse it only because the call has ended
    /// (`ClusterRoutes.unanswered`) and runs such requests in the order they come (a node of an
    /// older build may not), otherwise answered with what that node answered. An accept taken
    /// there is remembered for the device.
    private func forward(_ message: ClientMessage, about callID: CallID, from key: DeviceKey, to node: NodeID,
                         frame text: String?) async throws(ErrorMessage) -> AckResult {
        if routes.unanswered(message, about: callID, by: key) == node, let cluster, cluster.runsUnansweredInOrder(node) {
            cluster.send(.request(id: NodeMessage.unanswered, from: cluster.node, sender: key, frame: frame(message, text)), to: node)
            return .done
        }
        let result = try await forward(message, from: key, to: node, frame: text)
        if case .callAccept = message { routes.answered(callID, by: key, on: node) }
        return result
    }

    /// Sends a request to the node that runs its call or room and answers what that node answered.
    /// `frame`: the client's own text of the request, if it came from the device as is.
    private func forward(_ message: ClientMessage, from key: DeviceKey, to node: NodeID, frame text: String? = nil) async throws(ErrorMessage) -> AckResult {
        guard let cluster else { throw ErrorMessage(code: .internal, message: "no cluster") }
        guard !waitsEnded else { throw ErrorMessage(code: .unavailable, message: "the server is stopping; try again") }
        let id = routes.wait(.forward, on: node, until: now() + Self.forwardTimeout)
        let frame = frame(message, text)
        let result = await withCheckedContinuation { continuation in
            forwarded[id] = continuation
            cluster.send(.request(id: id, from: cluster.node, sender: key, frame: frame), to: node)
        }
        return try result.get()
    }

    /// A request's text for another node: the client's own, unless it is padded out far past what
    /// it says (whitespace is JSON too).
    private func frame(_ message: ClientMessage, _ text: String?) -> String {
        text.flatMap { $0.utf8.count <= 4096 ? $0 : nil } ?? String(decoding: codec.encode(message), as: UTF8.self)
    }

    private func answerForwarded(_ id: UInt64, _ result: Result<AckResult, ErrorMessage>) {
        guard routes.answered(id) == .forward else { return }
        forwarded.removeValue(forKey: id)?.resume(returning: result)
    }

    /// What another node says.
    private func hear(_ message: NodeMessage) async {
        guard let cluster else { return }
        switch message {
        case .deliver(let key, let frame, let from, let about):
            if !sessions.contains(key), let node = routes.sendOn(key) {
                // Handed over: on to the node that holds the session now, still from the call's owner.
                cluster.send(.deliver(to: key, frame: frame, from: from, about: about), to: node)
                return
            }
            // As it came, numbered here: all but a ring for a device without a connection, which
            // is decoded for its push.
            if let about, sessions.contains(key), about.type != "call.incoming" || sessions.isConnected(key) {
                if let call = about.call, calls[call] == nil { routes.heard(call, about.type, from: from, for: key) }
                send(encoded: frame, to: key)
                return
            }
            guard let sessionID = sessions.id(of: key) else { return }
            let decoded: ServerFrame
            do { decoded = try codec.decodeServerFrame(frame) } catch {
                // A node of another version, or a bug: the device misses the frame, and the log says so.
                logger.warning("a frame from another node could not be read; it is not delivered",
                               metadata: ["cluster.peer": "\(from)", "peer.device": "\(key)", "error": "\(error)"])
                return
            }
            if case .callIncoming(let incoming) = decoded.message, !sessions.isConnected(key) {
                await pushIncoming(incoming, to: key)
                // A new session of the device's meanwhile hears of the call from its owner (`claimed`).
                guard sessions.id(of: key) == sessionID else { return }
            }
            if let callID = decoded.message.aboutCall, calls[callID] == nil { routes.heard(decoded.message, from: from, for: key) }
            send(decoded.message, to: key)
        case .request(let id, let from, let sender, let frame):
            let result: Result<AckResult, ErrorMessage>
            do throws(ErrorMessage) {
                let request: ClientMessage
                do { request = try codec.decodeClientMessage(frame) } catch {
                    throw ErrorMessage(code: .badRequest, message: "a node forwarded what this one cannot read")
                }
                if !sessions.contains(sender) { routes.heard(sender, isOn: from) }
                // Run here as if its device were connected here (an invite only when its caller
                // sent it again from another node: `startCall`).
                result = .success(try await execute(request, from: Party(user: sender.user, device: sender.device)))
            } catch {
                result = .failure(error)
            }
            guard id != NodeMessage.unanswered else {
                // Acknowledged by the device's node already: a refusal here (the call ended) is the device's `call.ended`.
                if let error = result.failure {
                    logger.debug("a request sent on unanswered was refused", metadata: ["cluster.peer": "\(from)", "peer.device": "\(sender)",
                                                                                         "error": "\(error.message)"])
                }
                return
            }
            cluster.send(.reply(id: id, result: try? result.get(), error: result.failure), to: from)
        case .reply(let id, let result, let error):
            answerForwarded(id, error.map { .failure($0) } ?? .success(result ?? .done))
        // This node's own news, heard back on the channel every node listens to.
        case .claimed(_, let node) where node == cluster.node, .released(_, let node) where node == cluster.node:
            return
        case .claimed(let key, let node):
            routes.claimed(key, by: node)
            if sessions.contains(key) { forget(key) }
            // A device that connected elsewhere while a call to its user rings here rings too.
            for call in calls.ring(key) { deliver(.callIncoming(call.incoming), to: key) }
        case .left(let node):
            if node != cluster.node { await nodeLeft(node) }
        case .handover(let id, let key, let session, let from):
            cluster.send(.handedOver(id: id, session: handOver(session, of: key, to: from)), to: from)
        case .handedOver(let id, let handover):
            adopt(handover, answering: id, cluster: cluster)
        case .released(let key, let node):
            guard routes.released(key, by: node) else { return }
            for callID in calls.live(of: key.user) where calls[callID]?.participants.contains(key) == true {
                update(callID) { call, now in call.connectionLost(key, now: now) }
            }
            for room in rooms.rooms(of: key) { leaveRoom(room, key: key) }
        }
    }

    /// Another node asks for a session of a device held here (`fetchSession`): it is handed over if
    /// it is still the one named, and this node lets it go without ending anything.
    /// A session with a request still running here is not handed over (its answer would be lost, and
    /// the request run again there): the device gets a new session there, as before, and asks.
    private func handOver(_ session: String, of key: DeviceKey, to node: NodeID) -> SessionHandover? {
        guard let held = sessions[key], held.id == session, held.inFlight.isEmpty else { return nil }
        let handover = held.handover { encode(ServerFrame(seq: nil, message: $0)) }
        forget(key)
        routes.handedOver(key, to: node)
        logger.debug("session handed over", metadata: ["session.id": "\(session)", "peer.device": "\(key)", "cluster.to": "\(node)"])
        return handover
    }

    /// The answer to `fetchSession`: the session is held here from now (so frames sent on after it
    /// find it), and the hello waiting for it goes on and resumes it.
    private func adopt(_ handover: SessionHandover?, answering id: UInt64, cluster: any ClusterLink) {
        if let handover {
            let codec = self.codec
            if sessions.adopt(handover, now: now(), decode: { try? codec.decodeServerFrame($0).message }) {
                metrics.sessions.increment()
                routes.adopted(handover.key)
                cluster.holds(handover.key, true)
            } else {
                logger.notice("a session handed over came after its device had a new one here; its unacknowledged frames are lost",
                              metadata: ["session.id": "\(handover.id)", "peer.device": "\(handover.key)"])
            }
        }
        guard routes.answered(id) == .handover else { return }
        handovers.removeValue(forKey: id)?.resume()
    }

    /// A VoIP push for a call another node rings, to a device held here without a connection (the
    /// node running the call pushes only to devices no node holds).
    private func pushIncoming(_ incoming: CallIncoming, to key: DeviceKey) async {
        guard let pushes, let device = try? await store.devices(of: key.user).first(where: { $0.device == key.device }),
              let voip = device.voip, sessions[key]?.connectionID == nil else { return }
        let payload = VoIPPushPayload(parley: .init(call: incoming.call, from: .init(user: incoming.from.user, name: incoming.from.name),
                                                    media: incoming.media, expiresAt: incoming.expiresAt))
        pushes.yield(Push(user: key.user, device: key.device, registration: voip, content: .incomingCall(payload)))
    }


    /// Whether a room runs on this node: it has members here, or its row names this node (a join
    /// claims a room no live node runs). Always, with one node.
    private func runsHere(_ room: RoomID, claiming: Bool = true) async -> Bool {
        guard let cluster, rooms.members(of: room).isEmpty else { return true }
        do {
            guard let runner = try await cluster.roomOwner(room, claim: claiming) else { return true }
            return runner == cluster.node
        } catch {
            logger.error("could not find the node of a room", metadata: ["room": "\(room)", "error": "\(error)"])
            return true
        }
    }

    /// A node is gone: devices it held that take part in calls or rooms here are as if disconnected
    /// now (the resume window to come back on any node), and its unfinished calls are taken over.
    private func nodeLeft(_ node: NodeID) async {
        let (devices, waits, rejoins) = routes.nodeLeft(node)
        // What was forwarded there will not be answered: it is asked again of whoever runs it now.
        for (id, wait) in waits {
            end(wait, id, .failure(ErrorMessage(code: .unavailable, message: "the server running this call went away; try again")))
        }
        for key in devices {
            guard calls.isInCall(key) || !rooms.rooms(of: key).isEmpty, sessions.hold(key, now: now()) else { continue }
            metrics.sessions.increment()
        }
        await adopt()
        for (key, join) in rejoins {
            hand { await self.rejoin(join, by: key) }
        }
    }

    /// A device held here was in a room whose node is gone: it joins again where the room runs now
    /// (here, claiming it, or on the node that claimed it first), naming its Janus participant so
    /// that admission is kept. The room lists it as before; the device hears nothing of it.
    private func rejoin(_ join: RoomJoin, by key: DeviceKey) async {
        guard sessions.contains(key) else { return }
        do throws(ErrorMessage) {
            _ = try await execute(.roomJoin(join), requestID: join.id, from: Party(user: key.user, device: key.device))
        } catch {
            logger.warning("a room member could not be joined again where the room runs now",
                           metadata: ["room": "\(join.room)", "peer.device": "\(key)", "error": "\(error.message)"])
        }
    }

    /// Lets a session go that another node holds now. The device keeps its place in calls and rooms
    /// run here, as a device does that starts a new session: what is for it goes to that node
    /// (`routes`), and it leaves them when that node says its session ended (`released`).
    private func forget(_ key: DeviceKey) {
        guard let session = sessions.remove(key) else { return }
        routes.sessionGone(key)
        if let connectionID = session.connectionID {
            // 1001, not 4009: if this connection is the device's newest after all, it comes back.
            close(connectionID, code: .goingAway, reason: "this device connected to another server")
        }
        metrics.sessions.decrement()
    }

    // MARK: Frames out

    /// Sends to a device's session, live or held for resume, here or on the node that holds it; a
    /// device without one misses it.
    private func deliver(_ message: ServerMessage, to key: DeviceKey) {
        if send(message, to: key) { return }
        if let cluster, let node = routes.holder(of: key) {
            cluster.send(.deliver(to: key, frame: encode(ServerFrame(seq: nil, message: message)), from: cluster.node,
                                  about: DeliveredFrame(message)), to: node)
        }
    }

    /// Sends in the device's session: numbered and kept for resume, and written on its connection
    /// if it has one. False when the device has no session here.
    @discardableResult
    private func send(_ message: ServerMessage, to key: DeviceKey) -> Bool {
        guard let frame = sessions.number(for: key, { seq in encode(ServerFrame(seq: seq, message: message)) }) else { return false }
        if case .error(let error) = message { metrics.error(error.code) }
        write(frame, to: key)
        return true
    }

    /// Sends a frame another node encoded (a server frame without `seq`) in the device's session:
    /// numbered by writing `seq` before its fields, not decoded and encoded again.
    private func send(encoded frame: String, to key: DeviceKey) {
        guard frame.first == "{", let numbered = sessions.number(for: key, { seq in "{\"seq\":\(seq)," + frame.dropFirst() }) else { return }
        write(numbered, to: key)
    }

    /// Writes a numbered frame on the device's connection, if it has one.
    private func write(_ frame: (text: String, connection: UInt64?), to key: DeviceKey) {
        guard let connectionID = frame.connection, let entry = connections[connectionID] else { return }
        entry.connection.outbound.write(.text(frame.text))
        metrics.framesOut.increment()
    }

    /// Sends on a connection: numbered in its session after hello, unnumbered before.
    private func send(_ message: ServerMessage, on entry: ConnectionEntry) {
        if let key = entry.session, send(message, to: key) { return }
        if case .error(let error) = message { metrics.error(error.code) }
        entry.connection.outbound.write(.text(encode(ServerFrame(seq: nil, message: message))))
        metrics.framesOut.increment()
    }

    private func encode(_ frame: ServerFrame) -> String {
        codec.encodeText(frame)
    }

    // MARK: Time

    /// Applies every timeout that is due.
    public func sweep() {
        let now = now()
        let wallNow = wallClock()
        let silence = Duration.seconds(configuration.heartbeat * 3)
        for (id, entry) in connections {
            if entry.session == nil {
                if now - entry.connectedAt >= configuration.helloTimeout {
                    close(id, code: .helloTimeout, reason: "no hello in time")
                }
            } else if entry.connection.identity.expiresAt * 1000 <= wallNow {
                close(id, code: .tokenInvalid, reason: "the access token has expired")
            } else if now - entry.connection.lastActivity.withLockedValue({ $0 }) >= silence {
                close(id, code: .heartbeatTimeout, reason: "no heartbeat")
            }
        }
        for key in sessions.expired(at: now, window: configuration.resumeWindow) {
            expire(key)
        }
        for callID in calls.ringing(expiredBy: wallNow) {
            update(callID) { call, now in call.ringTimeout(now: now) }
        }
        calls.evict(at: now, retention: configuration.endedCallRetention) { records.isPending($0) }
        endWaits(at: now)
    }

    /// Ends the waits on other nodes whose deadline is past `now` (all of them for nil: the hub
    /// stops): a forwarded request fails as `unavailable`, a resume goes on without the session.
    private func endWaits(at now: Duration?) {
        for (id, wait) in routes.due(at: now) {
            end(wait, id, .failure(ErrorMessage(code: .unavailable, message: "the server running this call did not answer; try again")))
        }
    }

    /// Answers a waiter whose wait `routes` has ended.
    private func end(_ wait: ClusterRoutes.Wait, _ id: UInt64, _ failure: Result<AckResult, ErrorMessage>) {
        switch wait {
        case .forward: forwarded.removeValue(forKey: id)?.resume(returning: failure)
        case .handover: handovers.removeValue(forKey: id)?.resume()
        }
    }

    // MARK: Shutdown

    /// Stops taking connections and closes every one with 1001 (reconnect and resume). No call
    /// ends: their media does not run through the server, and the next start restores them from the
    /// store (`flushRecords()` makes sure they are there).
    public func shutdown() {
        shuttingDown = true
        for id in Array(connections.keys) {
            close(id, code: .goingAway, reason: "the server is going away")
        }
        pushes?.finish()
    }

    /// Ends the server's Janus session (after `shutdown()`): empty AudioBridge rooms are destroyed,
    /// rooms with members are left to the node that runs them next (`AudioBridgeRooms.shutdown`).
    public func closeRooms() async {
        await audioBridge?.shutdown()
    }

    // MARK: Introspection for tests and metrics

    public var connectionCount: Int { connections.count }
    /// Leaves of the device's waiting for its admissions to the room to end.
    func leavesWaiting(for key: DeviceKey, in room: RoomID) -> Int { admitting[key]?[room]?.leaves.count ?? 0 }
    public var isShuttingDown: Bool { shuttingDown }

    /// Whether a device of `user` is connected or held for resume.
    public func isPresent(_ user: UserID) -> Bool { !sessions.devices(of: user).isEmpty }
    public var sessionCount: Int { sessions.count }
}

extension JSONValue {
    /// Whether a string or a key in it holds U+0000, which PostgreSQL stores in neither `TEXT` nor
    /// `JSONB` (a call's metadata goes in the call's row).
    var holdsNUL: Bool {
        switch self {
        case .string(let text): text.utf8.contains(0)
        case .array(let values): values.contains { $0.holdsNUL }
        case .object(let members): members.contains { $0.key.utf8.contains(0) || $0.value.holdsNUL }
        case .null, .bool, .number: false
        }
    }
}
