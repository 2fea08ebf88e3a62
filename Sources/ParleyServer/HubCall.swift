import ParleyProtocol

/// One one-to-one call as the hub sees it (the SDK's `CallStateMachine` is one device's view).
///
/// ```
///            accept (first wins)           hangup by a party, connection-lost
///  ringing ─────────────────────▶ active ────────────────────────────────────▶ ended
///     │                                                                         ▲
///     └── decline, busy, cancel (caller hangs up), no-answer, connection-lost ──┘
/// ```
///
/// Every event is a `mutating` method that returns what to send to whom; the hub performs it.
/// A request that breaks a rule is refused with an `ErrorMessage` and leaves the state as it was.
struct HubCall {
    enum State: Equatable {
        case ringing
        case active(callee: DeviceID, answeredAt: Int64)
        case ended(reason: EndReason, endedAt: Int64)
    }

    let id: CallID
    let caller: Party
    let callee: UserID
    let media: MediaSpec
    let metadata: JSONValue?
    let createdAt: Int64
    let expiresAt: Int64
    private(set) var state: State = .ringing
    /// The callee's devices that were sent `call.incoming` and have not left the call since.
    private(set) var rungDevices: Set<DeviceID> = []
    private(set) var quality: CallQuality?
    private var ringingForwarded = false
    /// Ringing callee devices that take an offer while they ring (`call.ringing {early: true}`):
    /// the caller's signals may name them, and theirs reach the caller, before the answer.
    private(set) var earlyDevices: Set<DeviceID> = []
    /// Recording with consent: off, asked for by one device, or on (the stretch being recorded).
    enum Recording: Equatable {
        case off
        case requested(by: DeviceKey)
        case on(RecordingRecord)
    }
    private(set) var recording: Recording = .off
    /// The stretches recorded and finished.
    private var recorded: [RecordingRecord] = []
    /// The callee device of an answered call, kept after the end for the record.
    private var answeredDevice: DeviceID?
    private var answeredAt: Int64?

    init(id: CallID, caller: Party, callee: UserID, media: MediaSpec, metadata: JSONValue?, createdAt: Int64, expiresAt: Int64) {
        self.id = id
        self.caller = caller
        self.callee = callee
        self.media = media
        self.metadata = metadata
        self.createdAt = createdAt
        self.expiresAt = expiresAt
    }

    /// A call that had not ended when the previous server process stopped, as its store kept it.
    init(restoring stored: StoredCall) {
        let record = stored.record
        self.init(id: record.call, caller: Party(user: record.caller, device: record.callerDevice, name: stored.callerName),
                  callee: record.callee, media: record.media, metadata: stored.metadata, createdAt: record.createdAt,
                  expiresAt: stored.expiresAt)
        quality = record.quality
        for stretch in record.recordings ?? [] {
            if stretch.endedAt == nil { recording = .on(stretch) } else { recorded.append(stretch) }
        }
        if let device = record.calleeDevice, let answeredAt = record.answeredAt {
            state = .active(callee: device, answeredAt: answeredAt)
            answeredDevice = device
            self.answeredAt = answeredAt
            rungDevices = [device]
        }
    }

    var phase: CallPhase {
        switch state {
        case .ringing: .ringing
        case .active: .active
        case .ended: .ended
        }
    }

    var endReason: EndReason? {
        if case .ended(let reason, _) = state { return reason }
        return nil
    }

    var callerKey: DeviceKey { DeviceKey(user: caller.user, device: caller.device) }

    func involves(_ user: UserID) -> Bool { user == caller.user || user == callee }

    /// The devices currently in the call: the caller's, and the callee's answering device or ringing devices.
    var participants: [DeviceKey] {
        switch state {
        case .ringing: [callerKey] + rungDevices.sorted().map { DeviceKey(user: callee, device: $0) }
        case .active(let device, _): [callerKey, DeviceKey(user: callee, device: device)]
        case .ended: []
        }
    }

    var record: CallRecord {
        var record = CallRecord(call: id, caller: caller.user, callee: callee, callerDevice: caller.device,
                                calleeDevice: answeredDevice, media: media, createdAt: createdAt, answeredAt: answeredAt,
                                quality: quality)
        var stretches = recorded
        if case .on(let stretch) = recording { stretches.append(stretch) }
        if !stretches.isEmpty { record.recordings = stretches }
        if case .ended(let reason, let endedAt) = state {
            record.endedAt = endedAt
            record.reason = reason
            record.duration = duration(endedAt: endedAt)
        }
        return record
    }

    /// What the store keeps: the record, and what a restart needs to go on with the call.
    var stored: StoredCall {
        StoredCall(record: record, expiresAt: expiresAt, callerName: caller.name, metadata: metadata)
    }

    private func duration(endedAt: Int64) -> Double? {
        answeredAt.map { max(0, Double(endedAt - $0) / 1000) }
    }

    var incoming: CallIncoming {
        CallIncoming(call: id, from: caller, media: media, metadata: metadata, expiresAt: expiresAt)
    }

    // MARK: Events

    /// A callee device was sent `call.incoming`. Answers whether it is new to the call.
    @discardableResult
    mutating func rang(_ device: DeviceID) -> Bool {
        guard state == .ringing else { return false }
        return rungDevices.insert(device).inserted
    }

    /// `call.ringing` from a callee device: the caller hears of it once, and again of each device
    /// that rings `early` (the caller then connects to it while it rings).
    mutating func ringing(from sender: DeviceKey, early: Bool = false) throws(ErrorMessage) -> [Delivery] {
        try checkCallee(sender)
        switch state {
        case .ended: throw ended()
        case .active: return []
        case .ringing:
            rungDevices.insert(sender.device)
            let newlyEarly = early && earlyDevices.insert(sender.device).inserted
            guard !ringingForwarded || newlyEarly else { return [] }
            ringingForwarded = true
            return [Delivery(to: callerKey, message: .callRinging(CallRinging(call: id, device: sender.device, early: newlyEarly ? true : nil)))]
        }
    }

    mutating func accept(from sender: DeviceKey, now: Int64) throws(ErrorMessage) -> [Delivery] {
        try checkCallee(sender)
        switch state {
        case .ended: throw ended()
        case .active(let device, _) where device == sender.device:
            // The device that answered asks again (its answer was lost to a server restart): same answer.
            return []
        case .active: throw ErrorMessage(code: .callAlreadyAnswered, message: "the call was already answered")
        case .ringing:
            let others = rungDevices.subtracting([sender.device]).sorted()
            state = .active(callee: sender.device, answeredAt: now)
            answeredDevice = sender.device
            answeredAt = now
            rungDevices = [sender.device]
            earlyDevices = []
            let elsewhere = CallEnded(call: id, reason: .answeredElsewhere, endedAt: now)
            return [Delivery(to: callerKey, message: .callAccepted(CallAccepted(call: id, device: sender.device)))]
                + others.map { Delivery(to: DeviceKey(user: callee, device: $0), message: .callEnded(elsewhere)) }
        }
    }

    mutating func decline(from sender: DeviceKey, reason: EndReason, now: Int64) throws(ErrorMessage) -> [Delivery] {
        try checkCallee(sender)
        switch state {
        case .ended: throw ended()
        case .active: throw ErrorMessage(code: .callAlreadyAnswered, message: "the call was already answered")
        case .ringing: return end(reason: reason, by: sender, otherCalleeDevicesReason: .declinedElsewhere, now: now)
        }
    }

    mutating func hangup(from sender: DeviceKey, detail: String?, now: Int64) throws(ErrorMessage) -> [Delivery] {
        try checkParty(sender.user)
        switch state {
        case .ended:
            throw ended()
        case .ringing where sender == callerKey:
            return end(reason: .cancelled, detail: detail, by: sender, now: now)
        case .ringing where sender.user == callee:
            // A callee device hanging up before answering declines the call.
            return end(reason: .declined, detail: detail, by: sender, otherCalleeDevicesReason: .declinedElsewhere, now: now)
        case .ringing:
            throw notAParty()
        case .active:
            guard participants.contains(sender) else { throw notAParty() }
            return end(reason: .hangup, detail: detail, by: sender, now: now)
        }
    }

    /// `call.signal`: relayed to the other party of an accepted call, or while the call rings
    /// between the caller and a callee device that rang early (the caller names it as `device`).
    func signal(from sender: DeviceKey, device: DeviceID?, _ message: (Party) -> ServerMessage) throws(ErrorMessage) -> [Delivery] {
        try checkParty(sender.user)
        let party = Party(user: sender.user, device: sender.device)
        switch state {
        case .ringing where sender == callerKey:
            guard let device else { throw ErrorMessage(code: .callNotConnected, message: "the call has not been accepted yet") }
            guard earlyDevices.contains(device) else {
                throw ErrorMessage(code: .callNotConnected, message: "device \(device) does not take an offer while it rings")
            }
            return [Delivery(to: DeviceKey(user: callee, device: device), message: message(party))]
        case .ringing where sender.user == callee && earlyDevices.contains(sender.device):
            return [Delivery(to: callerKey, message: message(party))]
        case .active(let answered, _) where sender == callerKey && device != nil && device != answered:
            throw ErrorMessage(code: .callAlreadyAnswered, message: "the call was answered on another device")
        default:
            return try relay(from: sender, message)
        }
    }

    /// `call.update` (and `call.signal` once answered): relayed to the other party of an accepted call.
    func relay(from sender: DeviceKey, _ message: (Party) -> ServerMessage) throws(ErrorMessage) -> [Delivery] {
        let other = try otherParty(of: sender)
        return [Delivery(to: other, message: message(Party(user: sender.user, device: sender.device)))]
    }

    /// `call.update {recording}`: a step of recording with consent between the call's two devices
    /// (see `RecordingStep`). Recording goes on only once the party that did not ask agreed; the
    /// other party hears of every step. Answers the recording's state after the step.
    mutating func recordingStep(_ step: RecordingStep, from sender: DeviceKey, now: Int64) throws(ErrorMessage)
        -> (state: RecordingState, deliveries: [Delivery]) {
        let other = try otherParty(of: sender)
        let party = Party(user: sender.user, device: sender.device)
        func refused(_ message: String) -> ErrorMessage { ErrorMessage(code: .recordingState, message: message) }
        switch (step, recording) {
        case (.requested, .off):
            recording = .requested(by: sender)
        case (.requested, .requested):
            throw refused("recording was already requested")
        case (.requested, .on):
            throw refused("the call is already being recorded")
        case (.accepted, .requested(let asker)) where asker != sender:
            recording = .on(RecordingRecord(requestedBy: Party(user: asker.user, device: asker.device), consentedBy: party, startedAt: now))
        case (.declined, .requested(let asker)) where asker != sender:
            recording = .off
        case (.accepted, .requested), (.declined, .requested):
            throw refused("only the other party can answer a request to record")
        case (.accepted, _), (.declined, _):
            throw refused("no request to record is waiting for an answer")
        case (.stopped, .requested):
            recording = .off
        case (.stopped, .on(var stretch)):
            stretch.endedAt = now
            stretch.stoppedBy = party
            recorded.append(stretch)
            recording = .off
        case (.stopped, .off):
            throw refused("the call is not being recorded")
        }
        return (recordingState, [Delivery(to: other, message: .callUpdated(CallUpdated(call: id, from: party, recording: step)))])
    }

    var recordingState: RecordingState {
        switch recording {
        case .off: .off
        case .requested: .requested
        case .on: .on
        }
    }

    /// `call.report`: accepted from either user during the call and within `window` ms after its end.
    mutating func report(_ quality: CallQuality, from sender: DeviceKey, now: Int64, window: Int64) throws(ErrorMessage) {
        try checkParty(sender.user)
        if case .ended(_, let endedAt) = state, now - endedAt > window {
            throw ErrorMessage(code: .callEnded, message: "the call ended too long ago to report on")
        }
        self.quality = quality
    }

    mutating func ringTimeout(now: Int64) -> [Delivery] {
        guard state == .ringing else { return [] }
        return end(reason: .noAnswer, by: nil, now: now)
    }

    /// A device's session expired without resume. Ends the call when it was a party to it.
    mutating func connectionLost(_ device: DeviceKey, now: Int64) -> [Delivery] {
        switch state {
        case .ended:
            return []
        case .ringing where device != callerKey:
            // One of several ringing devices went away; the others keep ringing.
            rungDevices.remove(device.device)
            earlyDevices.remove(device.device)
            return []
        case .active where !participants.contains(device):
            return []
        case .ringing, .active:
            return end(reason: .connectionLost, by: device, now: now)
        }
    }

    // MARK: Helpers

    /// Ends the call: every participant but `sender` gets `call.ended`; other ringing callee devices
    /// get `otherCalleeDevicesReason` instead when given.
    private mutating func end(reason: EndReason, detail: String? = nil, by sender: DeviceKey?,
                              otherCalleeDevicesReason: EndReason? = nil, now: Int64) -> [Delivery] {
        let recipients = participants.filter { $0 != sender }
        let duration = duration(endedAt: now)
        state = .ended(reason: reason, endedAt: now)
        if case .on(var stretch) = recording {
            stretch.endedAt = now
            recorded.append(stretch)
        }
        recording = .off
        rungDevices = []
        earlyDevices = []
        return recipients.map { key in
            var reasonForKey = reason
            if let other = otherCalleeDevicesReason, key.user == callee, key != callerKey { reasonForKey = other }
            return Delivery(to: key, message: .callEnded(CallEnded(call: id, reason: reasonForKey, detail: detail,
                                                                   endedAt: now, duration: duration)))
        }
    }

    /// The device at the other end of an accepted call from `sender`, one of its two devices.
    private func otherParty(of sender: DeviceKey) throws(ErrorMessage) -> DeviceKey {
        try checkParty(sender.user)
        switch state {
        case .ended: throw ended()
        case .ringing: throw ErrorMessage(code: .callNotConnected, message: "the call has not been accepted yet")
        case .active(let calleeDevice, _):
            let calleeKey = DeviceKey(user: callee, device: calleeDevice)
            if sender == callerKey { return calleeKey }
            if sender == calleeKey { return callerKey }
            throw notAParty()
        }
    }

    private func checkParty(_ user: UserID) throws(ErrorMessage) {
        guard involves(user) else { throw ErrorMessage(code: .callNotFound, message: "no such call") }
    }

    private func checkCallee(_ sender: DeviceKey) throws(ErrorMessage) {
        try checkParty(sender.user)
        guard sender.user == callee else {
            throw ErrorMessage(code: .forbidden, message: "only the callee can ring, accept or decline a call")
        }
    }

    private func ended() -> ErrorMessage {
        ErrorMessage(code: .callEnded, message: "the call has ended (\(endReason?.rawValue ?? "ended"))")
    }

    private func notAParty() -> ErrorMessage {
        ErrorMessage(code: .forbidden, message: "this device is not a party to the call")
    }
}
