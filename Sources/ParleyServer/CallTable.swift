import DequeModule
import ParleyProtocol

/// The calls one node runs: each call's state machine, the calls not yet ended by each user taking
/// part, and ended calls kept for a while for `call.state` and `call.report`.
///
/// A value, like the state machines it holds: `apply` runs one event on one call and answers what
/// to deliver and how the call's phase changed; the hub delivers, stores and counts.
struct CallTable {
    /// A call whose phase an event changed.
    struct Transition {
        var from: CallPhase
        var call: HubCall
    }

    private var calls: [CallID: HubCall] = [:]
    private var liveByUser: [UserID: Set<CallID>] = [:]
    /// Ended calls, oldest first, with when they ended.
    private var ended: Deque<(call: CallID, at: Duration)> = []

    subscript(id: CallID) -> HubCall? { calls[id] }

    /// The user's calls that have not ended, in id order.
    func live(of user: UserID) -> [CallID] {
        (liveByUser[user] ?? []).sorted { $0.rawValue < $1.rawValue }
    }

    /// Whether the device takes part in a call that has not ended.
    func isInCall(_ key: DeviceKey) -> Bool {
        live(of: key.user).contains { calls[$0]?.participants.contains(key) == true }
    }

    /// The ringing calls whose ring timeout is due at `wallNow` (Unix milliseconds).
    func ringing(expiredBy wallNow: Int64) -> [CallID] {
        calls.values.filter { $0.phase == .ringing && $0.expiresAt <= wallNow }.map(\.id)
    }

    /// A call that has not ended, new or restored; an id the table holds already is left alone.
    mutating func insert(_ call: HubCall) {
        guard calls[call.id] == nil else { return }
        calls[call.id] = call
        liveByUser[call.caller.user, default: []].insert(call.id)
        liveByUser[call.callee, default: []].insert(call.id)
    }

    /// Runs one event on a call: nil when the table does not hold it. A refused event (it throws)
    /// leaves the call as it was. `at`: the hub's time, for how long an ended call is kept.
    mutating func apply(_ id: CallID, at now: Duration, wallClock: Int64,
                        _ event: (inout HubCall, Int64) throws(ErrorMessage) -> [Delivery])
        throws(ErrorMessage) -> (deliveries: [Delivery], transition: Transition?)? {
        // One lookup of the id: a relayed frame is an event on its call.
        guard let index = calls.index(forKey: id) else { return nil }
        var call = calls.values[index]
        let before = call.phase
        let deliveries = try event(&call, wallClock)
        calls.values[index] = call
        guard call.phase != before else { return (deliveries, nil) }
        if call.phase == .ended {
            for user in [call.caller.user, call.callee] {
                liveByUser[user]?.remove(id)
                if liveByUser[user]?.isEmpty == true { liveByUser[user] = nil }
            }
            ended.append((id, now))
        }
        return (deliveries, Transition(from: before, call: call))
    }

    /// Rings a device in every call to its user that still rings (a device that arrived late):
    /// answers those calls.
    mutating func ring(_ key: DeviceKey) -> [HubCall] {
        var rung: [HubCall] = []
        for id in live(of: key.user) {
            guard calls[id]?.phase == .ringing, calls[id]?.callee == key.user else { continue }
            calls[id]!.rang(key.device)
            rung.append(calls[id]!)
        }
        return rung
    }

    /// Forgets calls ended at least `retention` ago, oldest first, stopping at the first one `keep`
    /// holds back (its record not yet stored: until then the store cannot answer for it).
    mutating func evict(at now: Duration, retention: Duration, keep: (CallID) -> Bool) {
        while let oldest = ended.first, now - oldest.at >= retention, !keep(oldest.call) {
            ended.removeFirst()
            calls[oldest.call] = nil
        }
    }
}
