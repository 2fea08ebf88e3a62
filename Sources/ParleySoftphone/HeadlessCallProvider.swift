import Foundation
import ParleyKit
import ParleyProtocol

/// The "system" of a headless Linux softphone: there is no CallKit, so user commands become
/// provider actions directly, and audio is available as soon as a call starts or is answered.
public final class HeadlessCallProvider: SystemCallProvider, @unchecked Sendable {
    public enum Notice: Hashable, Sendable {
        case incoming(IncomingCallReport)
        case ended(UUID, SystemEndReason)
    }

    public let actions: AsyncStream<ProviderAction>
    /// What the SDK reported to "the system": incoming calls and calls that ended remotely.
    public let notices: AsyncStream<Notice>
    private let actionSink: AsyncStream<ProviderAction>.Continuation
    private let noticeSink: AsyncStream<Notice>.Continuation
    private let lock = NSLock()
    private var activating: Set<ProviderActionID> = []

    public init() {
        (actions, actionSink) = AsyncStream.makeStream()
        (notices, noticeSink) = AsyncStream.makeStream()
    }

    deinit {
        actionSink.finish()
        noticeSink.finish()
    }

    public func startCall(_ call: UUID, to user: UserID, video: Bool) { perform(activates: true) { .start($0, call: call, to: user, video: video) } }
    public func answer(_ call: UUID) { perform(activates: true) { .answer($0, call: call) } }
    public func end(_ call: UUID) { perform { .end($0, call: call) } }
    public func setMuted(_ call: UUID, _ muted: Bool) { perform { .setMuted($0, call: call, muted: muted) } }
    public func setHeld(_ call: UUID, _ held: Bool) { perform { .setHeld($0, call: call, held: held) } }

    private func perform(activates: Bool = false, _ make: (ProviderActionID) -> ProviderAction) {
        let id = ProviderActionID()
        if activates { lock.withLock { _ = activating.insert(id) } }
        actionSink.yield(make(id))
    }

    public func reportIncomingCall(_ report: IncomingCallReport) async throws { noticeSink.yield(.incoming(report)) }
    public func reportOutgoingCallStartedConnecting(_ call: UUID) async {}
    public func reportOutgoingCallConnected(_ call: UUID) async {}
    public func reportCallEnded(_ call: UUID, reason: SystemEndReason) async { noticeSink.yield(.ended(call, reason)) }

    public func fulfill(_ action: ProviderActionID) async {
        // As CallKit does after a start or answer action, activate audio.
        if lock.withLock({ activating.remove(action) != nil }) { actionSink.yield(.audioSessionActivated) }
    }

    public func fail(_ action: ProviderActionID) async { lock.withLock { _ = activating.remove(action) } }
}

/// On Linux the media engine owns the devices; the audio session only records what was asked.
public final class EngineAudioSession: AudioSession, @unchecked Sendable {
    private let lock = NSLock()
    private var enabled = false
    public init() {}
    public var isAudioEnabled: Bool { lock.withLock { enabled } }
    public func configure(_ configuration: CallAudioConfiguration) async {}
    public func setAudioEnabled(_ enabled: Bool) async { lock.withLock { self.enabled = enabled } }
    public func overrideOutputToSpeaker(_ speaker: Bool) async {}
    public func route(to output: AudioOutput) async {}
}
