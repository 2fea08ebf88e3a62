import Foundation
import ParleyKit
import ParleyProtocol

/// A system call provider for tests and headless use: records what the app reports and lets the
/// test act as the user (answer, end, hold…) and as the system (audio activation, reset). It checks
/// what CallKit checks: a UUID reported twice, actions fulfilled or failed twice or never asked for
/// (`violations`), and actions left open (`openActions`), which CallKit times out. Tests fail on
/// either when they stop their devices.
public final class FakeSystemCallProvider: SystemCallProvider, @unchecked Sendable {
    public enum Record: Hashable, Sendable {
        case incoming(IncomingCallReport)
        case startedConnecting(UUID)
        case connected(UUID)
        case ended(UUID, SystemEndReason)
        case fulfilled(ProviderActionID)
        case failed(ProviderActionID)
    }

    public struct Refusal: Error {}

    public let actions: AsyncStream<ProviderAction>
    private let sink: AsyncStream<ProviderAction>.Continuation
    private let lock = NSLock()
    private var log: [Record] = []
    private var open: Set<ProviderActionID> = []
    private var known: Set<UUID> = []
    /// Mistakes the app made that CallKit would have refused or crashed on.
    public private(set) var violations: [String] = []
    /// When true, incoming calls are refused (Do Not Disturb).
    public var refuseIncoming = false

    public init() { (actions, sink) = AsyncStream.makeStream() }

    public var records: [Record] { lock.withLock { log } }

    /// Actions the app was given and has neither fulfilled nor failed: CallKit times each out, and
    /// the user sees the call fail. A test ends with none (`SDKDevice.stop()` checks).
    public var openActions: Set<ProviderActionID> { lock.withLock { open } }

    /// What happened to an action: fulfilled, failed, or still open (nil).
    public func outcome(of action: ProviderActionID) -> Bool? {
        lock.withLock {
            if log.contains(.fulfilled(action)) { return true }
            if log.contains(.failed(action)) { return false }
            return nil
        }
    }

    public func endReason(of call: UUID) -> SystemEndReason? {
        lock.withLock {
            for record in log { if case .ended(call, let reason) = record { return reason } }
            return nil
        }
    }

    /// Acts as the system: delivers an action to the app.
    @discardableResult
    public func perform(_ make: (ProviderActionID) -> ProviderAction) -> ProviderActionID {
        let id = ProviderActionID()
        let action = make(id)
        lock.withLock {
            switch action {
            case .audioSessionActivated, .audioSessionDeactivated, .reset: break
            default: open.insert(id)
            }
            if case .start(_, let call, _, _) = action { known.insert(call) }
        }
        sink.yield(action)
        return id
    }

    public func deliver(_ action: ProviderAction) { sink.yield(action) }

    public func reportIncomingCall(_ report: IncomingCallReport) async throws {
        try lock.withLock {
            if refuseIncoming { throw Refusal() }
            guard known.insert(report.call).inserted else {
                // CallKit answers callUUIDAlreadyExists; reporting is still what the push rule wants.
                throw Refusal()
            }
            log.append(.incoming(report))
        }
    }

    public func reportOutgoingCallStartedConnecting(_ call: UUID) async { lock.withLock { log.append(.startedConnecting(call)) } }
    public func reportOutgoingCallConnected(_ call: UUID) async { lock.withLock { log.append(.connected(call)) } }

    public func reportCallEnded(_ call: UUID, reason: SystemEndReason) async {
        lock.withLock {
            if !known.contains(call) { violations.append("ended a call the system never heard of: \(call)") }
            log.append(.ended(call, reason))
        }
    }

    public func fulfill(_ action: ProviderActionID) async { complete(action, .fulfilled(action)) }
    public func fail(_ action: ProviderActionID) async { complete(action, .failed(action)) }

    private func complete(_ action: ProviderActionID, _ record: Record) {
        lock.withLock {
            if open.remove(action) == nil { violations.append("completed an action that was not open: \(action)") }
            log.append(record)
        }
    }
}

/// Records what the SDK asks of the audio session.
public final class FakeAudioSession: AudioSession, @unchecked Sendable {
    public indirect enum Record: Hashable, Sendable {
        case configured(video: Bool)
        case audioEnabled(Bool)
        case speaker(Bool)
        case routed(AudioOutput)
        /// An override or a route asked for before the session was configured for a call: iOS
        /// refuses an output override outside the playAndRecord category the configuration sets.
        case refused(Record)
    }

    private let lock = NSLock()
    private var log: [Record] = []

    public init() {}

    public var records: [Record] { lock.withLock { log } }
    /// What iOS would have refused (`Record.refused`).
    public var refusals: [Record] { lock.withLock { log.filter { if case .refused = $0 { true } else { false } } } }
    public var isAudioEnabled: Bool {
        lock.withLock {
            for record in log.reversed() { if case .audioEnabled(let on) = record { return on } }
            return false
        }
    }

    public func configure(_ configuration: CallAudioConfiguration) async { lock.withLock { log.append(.configured(video: configuration.video)) } }
    public func setAudioEnabled(_ enabled: Bool) async { lock.withLock { log.append(.audioEnabled(enabled)) } }
    public func overrideOutputToSpeaker(_ speaker: Bool) async { lock.withLock { log.append(ifConfigured(.speaker(speaker))) } }
    public func route(to output: AudioOutput) async { lock.withLock { log.append(ifConfigured(.routed(output))) } }

    /// (Under the lock.)
    private func ifConfigured(_ record: Record) -> Record {
        log.contains { if case .configured = $0 { true } else { false } } ? record : .refused(record)
    }
}
