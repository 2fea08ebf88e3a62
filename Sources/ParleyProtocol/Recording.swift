/// A step of recording a call with consent, sent in `call.update {recording}` and relayed in
/// `call.updated {recording}`:
///
/// ```
///        requested (a party)         accepted (the other party)
///  off ──────────────────▶ requested ──────────────────────────▶ on
///   ▲                         │                                   │
///   └─ declined (the other) ──┤                                   │
///   └─ stopped (either) ──────┘◀──────── stopped (either), the call's end
/// ```
public enum RecordingStep: String, Hashable, Sendable, Codable, CaseIterable {
    case requested
    case accepted
    case declined
    case stopped
}

/// Where a call's recording stands on the server; the ack of a recording step carries it.
public enum RecordingState: String, Hashable, Sendable, Codable {
    case off
    case requested
    case on
}

/// The answer to a recording step: the state it left the call's recording in.
public struct RecordingStepResult: Hashable, Sendable, Codable {
    public var recording: RecordingState

    public init(recording: RecordingState) { self.recording = recording }
}

/// One stretch of a call that was recorded, as the call record keeps it: who asked, who agreed,
/// from when to when (Unix milliseconds), and who stopped it (absent when the call's end did).
public struct RecordingRecord: Hashable, Sendable, Codable {
    public var requestedBy: Party
    public var consentedBy: Party
    public var startedAt: Int64
    public var endedAt: Int64?
    public var stoppedBy: Party?

    public init(requestedBy: Party, consentedBy: Party, startedAt: Int64, endedAt: Int64? = nil, stoppedBy: Party? = nil) {
        self.requestedBy = requestedBy
        self.consentedBy = consentedBy
        self.startedAt = startedAt
        self.endedAt = endedAt
        self.stoppedBy = stoppedBy
    }
}
