import Foundation
import Logging
import ParleyProtocol
import ParleyServer
import ParleyTesting

/// The hub as a whole, driven by a fuzzer: the input is a script of steps by three devices of two
/// users (alice's phone and laptop, bob's phone) on a manual clock — connect or resume, drop the
/// connection, call requests on four call ids (to alice, bob or carol, who has no device), room joins
/// and leaves, acks, time passing — and after every step what must hold of everything the hub wrote is
/// checked:
///
/// - every request is answered exactly once, before the next step (an ack or an error naming it);
/// - no frame about a call reaches a device of anyone but its caller and callee, and none about a call
///   nobody made;
/// - a device is told once that a call ended, and is told nothing of it afterwards; a `call.state` it
///   asks for afterwards says the call ended (one call is never in two states);
/// - every call a device was told had ended is in the store as ended, with a reason, once.
///
/// Frames replayed on a resume are read as a client reads them: by `seq`, each once.
enum HubScript {
    /// The most steps an input runs: two bytes a step.
    static let maxSteps = 256

    static func run(_ data: Data, _ fail: (String) -> FuzzFailure) async throws(FuzzFailure) {
        let world = HubWorld()
        // The hub's record writer runs beside the script, as under the server.
        let records = world.hub.records
        let broken: String? = await withTaskGroup(of: Void.self) { writer in
            writer.addTask { await records.run() }
            defer { writer.cancelAll() }
            var bytes = data.makeIterator()
            var steps = 0
            while let op = bytes.next(), steps < maxSteps {
                let argument = bytes.next() ?? 0
                steps += 1
                await world.step(op: op, argument: argument)
                if let broken = world.check() {
                    await world.close()
                    return "after step \(steps) (\(op % HubWorld.operations), \(argument)): \(broken)"
                }
            }
            return await world.finish().map { "at the end: \($0)" }
        }
        if let broken { throw fail(broken) }
    }
}

/// What the hub wrote to one connection, kept in order.
final class CapturingSink: ConnectionSink, @unchecked Sendable {
    private let lock = NSLock()
    private var frames: [OutboundFrame] = []

    func write(_ frame: OutboundFrame) {
        lock.withLock { frames.append(frame) }
    }

    func finish() {}

    func take() -> [OutboundFrame] {
        lock.withLock {
            defer { frames.removeAll() }
            return frames
        }
    }
}

/// One hub and its devices, driven from one task.
final class HubWorld {
    struct Device {
        var user: UserID
        var id: DeviceID
        var connection: Connection?
        var sink: CapturingSink?
        var session: String?
        var lastSeq = 0
        var requests = 0
        /// Requests sent on this connection and not yet answered, and every request answered.
        var waiting: Set<String> = []
        var answered: Set<String> = []
        /// `call.state` requests in flight, by request id.
        var stateAsked: [String: CallID] = [:]
        var ended: Set<CallID> = []

        var name: String { "\(user)/\(id)" }
    }

    static let operations: UInt8 = 14
    static let users: [UserID] = ["alice", "bob", "carol"].map { UserID(rawValue: $0)! }
    static let calls: [CallID] = (0..<4).map { CallID(rawValue: "00000000-0000-4000-8000-00000000000\($0)")! }

    let clock = ManualClock()
    let store: SQLiteStore
    let hub: SignalingHub<ManualClock>
    let codec = WireCodec()
    var devices: [Device] = [
        Device(user: users[0], id: DeviceID(rawValue: "phone")!),
        Device(user: users[0], id: DeviceID(rawValue: "laptop")!),
        Device(user: users[1], id: DeviceID(rawValue: "phone")!),
    ]
    /// Who is in each call, once the hub let its invite through: the caller's device, the callee,
    /// and the callee's device that answered (once the caller was told).
    struct Parties {
        var caller: UserID
        var callerDevice: DeviceID
        var callee: UserID
        var answered: DeviceID?
    }
    var parties: [CallID: Parties] = [:]
    /// Invites sent and not yet answered, by device and request id: the hub may ring the callee before
    /// the caller's ack is read.
    var pendingInvites: [String: Parties] = [:]
    var invitedCalls: [String: CallID] = [:]
    var endedCalls: Set<CallID> = []
    var nextConnection: UInt64 = 0
    var broken: String?

    init() {
        store = try! SQLiteStore(path: nil)
        var configuration = ServerConfiguration()
        configuration.databasePath = nil
        var logger = Logger(label: "fuzz.hub")
        logger.logLevel = .critical
        let clock = clock
        hub = SignalingHub(configuration: configuration, store: store, clock: clock, logger: logger, wallClock: { clock.wallNow })
    }

    /// The argument's low six bits pick the device (mod 3), the call (/ 3 mod 4) and an invite's
    /// callee (/ 12 mod 3); its two high bits are flags of some operations.
    func step(op: UInt8, argument: UInt8) async {
        let selector = Int(argument & 0x3F)
        let index = selector % 3
        let call = Self.calls[(selector / 3) % Self.calls.count]
        switch op % Self.operations {
        case 0: await connect(index)
        case 1: await drop(index)
        case 2:
            let callee = Self.users[(selector / 12) % Self.users.count]
            let id = request(index)
            pendingInvites[key(index, id)] = Parties(caller: devices[index].user, callerDevice: devices[index].id, callee: callee)
            invitedCalls[key(index, id)] = call
            await send(index, id, .callInvite(CallInvite(id: id, call: call, to: callee)))
        case 3: await send(index, .callRinging(CallRingingRequest(id: request(index), call: call)))
        case 4: await send(index, .callAccept(CallRequest(id: request(index), call: call)))
        case 5: await send(index, .callDecline(CallDecline(id: request(index), call: call, reason: argument & 0x80 == 0 ? .declined : .busy)))
        case 6: await send(index, .callHangup(CallHangup(id: request(index), call: call)))
        case 7:
            let signal = SignalPayload(description: SessionDescription(type: argument & 0x80 == 0 ? "offer" : "answer", sdp: "v=0\r\n"))
            await send(index, .callSignal(CallSignal(id: request(index), call: call, signal: signal)))
        case 8: await send(index, .callUpdate(CallUpdate(id: request(index), call: call, muted: argument & 0x40 != 0, held: argument & 0x80 != 0)))
        case 9:
            let id = request(index)
            if devices[index].connection != nil { devices[index].stateAsked[id] = call }
            await send(index, id, .callState(CallRequest(id: id, call: call)))
        case 10:
            clock.advance(by: .milliseconds(250 * Int(argument)))
            await hub.sweep()
        case 11:
            let room = RoomID(rawValue: "room\(selector % 2)")!
            if argument & 0x80 == 0 {
                await send(index, .roomJoin(RoomJoin(id: request(index), room: room)))
            } else {
                await send(index, .roomLeave(RoomLeave(id: request(index), room: room)))
            }
        case 13:
            // A step of recording with consent, picked by the two high bits.
            let step = RecordingStep.allCases[Int(argument >> 6)]
            await send(index, .callUpdate(CallUpdate(id: request(index), call: call, recording: step)))
        default: await send(index, .ack(SeqAck(seq: devices[index].lastSeq)))
        }
        await collect()
    }

    private func key(_ index: Int, _ id: String) -> String { "\(index) \(id)" }

    private func request(_ index: Int) -> String {
        devices[index].requests += 1
        return "r\(devices[index].requests)"
    }

    private func connect(_ index: Int) async {
        guard devices[index].connection == nil else { return }
        nextConnection += 1
        let sink = CapturingSink()
        let device = devices[index]
        let identity = Identity(user: device.user, name: nil, expiresAt: clock.wallNow / 1000 + 86_400)
        let connection = Connection(id: nextConnection, identity: identity, outbound: sink, now: hub.now())
        devices[index].connection = connection
        devices[index].sink = sink
        await hub.connect(connection)
        let resume = device.session.map { ResumeRequest(session: $0, lastSeq: device.lastSeq) }
        let id = request(index)
        devices[index].waiting.insert(id)
        await hub.receive(connection.id, .hello(Hello(id: id, device: device.id, resume: resume)))
    }

    private func drop(_ index: Int) async {
        guard devices[index].connection != nil else { return }
        await collect()
        await disconnect(index)
    }

    /// The connection is gone (dropped, or closed by the hub): what was not answered is lost with it,
    /// as a client's would be.
    private func disconnect(_ index: Int) async {
        guard let connection = devices[index].connection else { return }
        await hub.disconnected(connection.id)
        devices[index].connection = nil
        devices[index].sink = nil
        devices[index].stateAsked.removeAll()
        for id in devices[index].waiting {
            pendingInvites.removeValue(forKey: key(index, id))
            invitedCalls.removeValue(forKey: key(index, id))
        }
        devices[index].waiting.removeAll()
    }

    private func send(_ index: Int, _ message: ClientMessage) async {
        await send(index, message.requestID, message)
    }

    private func send(_ index: Int, _ id: String?, _ message: ClientMessage) async {
        guard let connection = devices[index].connection else {
            if let id { pendingInvites.removeValue(forKey: key(index, id)) }
            return
        }
        if let id { devices[index].waiting.insert(id) }
        connection.touch(now: hub.now())
        await hub.receive(connection.id, message)
    }

    /// Reads what every connection got, as its client would; a close ends the connection.
    private func collect() async {
        for index in devices.indices {
            guard let sink = devices[index].sink else { continue }
            for written in sink.take() {
                guard broken == nil else { return }
                guard case .text(let text) = written else {
                    await disconnect(index)
                    break
                }
                let frame: ServerFrame
                do { frame = try codec.decodeServerFrame(Data(text.utf8)) } catch {
                    return note("the hub wrote a frame a client cannot read: \(error) — \(text)")
                }
                read(frame, on: index)
            }
        }
        if let ring = replayedRings.values.sorted().first { note(ring) }
        replayedRings.removeAll()
    }

    private func read(_ frame: ServerFrame, on index: Int) {
        if let seq = frame.seq {
            guard seq > devices[index].lastSeq else { return }  // replayed, and read before
            if seq != devices[index].lastSeq + 1 {
                note("\(devices[index].name) got seq \(seq) after \(devices[index].lastSeq): frames between were lost")
            }
            devices[index].lastSeq = seq
        }
        switch frame.message {
        case .welcome(let welcome):
            answer(welcome.re, on: index)
            if !welcome.resumed || welcome.session != devices[index].session {
                // A new session numbers from 1; what a device was told ended stays ended.
                devices[index].session = welcome.session
                devices[index].lastSeq = frame.seq ?? 0
            }
        case .ack(let ack):
            answer(ack.re, on: index)
            if let invite = pendingInvites.removeValue(forKey: key(index, ack.re)),
               let call = invitedCalls.removeValue(forKey: key(index, ack.re)), parties[call] == nil {
                parties[call] = invite
            }
            if let call = devices[index].stateAsked.removeValue(forKey: ack.re), endedCalls.contains(call) {
                guard let state = try? ack.decodeResult(CallStateResult.self) else {
                    return note("\(devices[index].name)'s call.state \(ack.re) was answered with \(ack.result)")
                }
                if state.state != .ended {
                    note("call \(call) ended, and call.state then told \(devices[index].name) \(state.state)")
                }
            }
        case .error(let error):
            if let re = error.re {
                answer(re, on: index)
                pendingInvites.removeValue(forKey: key(index, re))
                invitedCalls.removeValue(forKey: key(index, re))
                devices[index].stateAsked.removeValue(forKey: re)
            }
        case .callIncoming(let m): about(m.call, frame, on: index)
        case .callRinging(let m): about(m.call, frame, on: index)
        case .callAccepted(let m):
            about(m.call, frame, on: index)
            parties[m.call]?.answered = m.device
        case .callSignal(let m): about(m.call, frame, on: index)
        case .callUpdated(let m): about(m.call, frame, on: index)
        case .callEnded(let m):
            about(m.call, frame, on: index)
            replayedRings.removeValue(forKey: "\(index) \(m.call)")
            guard devices[index].ended.insert(m.call).inserted else {
                return note("\(devices[index].name) was told twice that call \(m.call) ended")
            }
            // Answered on another device: over for this one, not for the call. (Declined elsewhere
            // ends the call: a decline ends it for everyone.)
            if m.reason != .answeredElsewhere { endedCalls.insert(m.call) }
        case .roomParticipantJoined, .roomParticipantLeft, .roomSignal:
            break
        }
    }

    private func answer(_ re: String, on index: Int) {
        let name = devices[index].name
        guard devices[index].answered.insert(re).inserted else { return note("\(name)'s request \(re) was answered twice") }
        guard devices[index].waiting.remove(re) != nil else { return note("\(name) got an answer to \(re), which it never sent") }
    }

    private func about(_ call: CallID, _ frame: ServerFrame, on index: Int) {
        let device = devices[index]
        if parties[call] == nil, let pending = pendingInvites.first(where: { invitedCalls[$0.key] == call }) {
            parties[call] = pending.value  // rung before the caller's ack was read
        }
        guard let parties = parties[call] else { return note("\(device.name) got \(frame.message.type) for call \(call), which nobody made") }
        if device.user == parties.caller, device.id != parties.callerDevice {
            return note("\(device.name) got \(frame.message.type) for call \(call), made from \(parties.caller)/\(parties.callerDevice)")
        }
        guard device.user == parties.caller || device.user == parties.callee else {
            return note("\(device.name) got \(frame.message.type) for call \(call) between \(parties.caller) and \(parties.callee)")
        }
        if device.user == parties.callee, let answered = parties.answered, device.id != answered {
            // Once answered, another callee device hears only that it was answered elsewhere — but
            // a resume replays what was buffered before the answer: a ring is fine if the end follows.
            if case .callIncoming = frame.message {
                replayedRings["\(index) \(call)"] = "\(device.name) got call.incoming for call \(call), answered on \(parties.callee)/\(answered), and no end after it"
                return
            }
            guard case .callEnded(let ended) = frame.message, ended.reason == .answeredElsewhere else {
                return note("\(device.name) got \(frame.message.type) for call \(call), answered on \(parties.callee)/\(answered)")
            }
        }
        if device.ended.contains(call) {
            note("\(device.name) got \(frame.message.type) for call \(call) after it ended")
        }
    }

    /// Rings read after the call was answered elsewhere, each waiting for its end in the same read.
    private var replayedRings: [String: String] = [:]

    private func note(_ text: String) {
        if broken == nil { broken = text }
    }

    func check() -> String? {
        if broken != nil { return broken }
        for device in devices where device.connection != nil && !device.waiting.isEmpty {
            return "\(device.name) had no answer to \(device.waiting.sorted().joined(separator: ", "))"
        }
        return nil
    }

    func finish() async -> String? {
        await hub.flushRecords()
        for call in endedCalls.sorted(by: { $0.rawValue < $1.rawValue }) {
            guard let record = try? await store.call(call) else {
                await hub.shutdown()
                return "call \(call) ended but is not in the store"
            }
            guard record.endedAt != nil, record.reason != nil else {
                await hub.shutdown()
                return "call \(call) ended but its record says \(record)"
            }
        }
        await hub.shutdown()
        return nil
    }

    func close() async {
        await hub.shutdown()
    }
}
