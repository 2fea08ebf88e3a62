// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import AVFAudio
import CallKit
import Foundation
import ParleyKit
import ParleyProtocol

/// The SDK's `SystemCallProvider` over CallKit: `CXProvider` for what the system shows and asks,
/// `CXCallController` for what the app asks of it. Thin by design: every action goes to the core
/// as a `ProviderAction`, and the core fulfils or fails it (docs/ios.md, the rules iOS imposes).
///
/// One per app, as Apple asks: `CallSystem` makes it at launch, and each signed-in phone's
/// `CallManager` takes its actions in turn (`actions`). While no phone runs, the system's actions
/// fail and VoIP pushes are reported and ended (`PushKitVoIPSource`).
public final class CallKitProvider: NSObject, SystemCallProvider, CXProviderDelegate, @unchecked Sendable {
    public struct Configuration: Sendable {
        /// A sound file in the app bundle; nil for the system ringtone.
        public var ringtoneSound: String?
        /// A 40×40 pt template image (PNG) for the call UI's app button.
        public var iconTemplateImageData: Data?
        public var supportsVideo = true
        /// Two groups: one call, and one more that waits (call waiting: hold and answer, end and answer).
        public var maximumCallGroups = 2
        public var maximumCallsPerCallGroup = 1
        public var includesCallsInRecents = true

        public init() {}
    }

    /// The system's provider (to report call updates the SDK does not make, e.g. a new caller name).
    public let provider: CXProvider
    private let controller = CXCallController()
    private let queue = DispatchQueue(label: "net.parley.callkit")
    private let lock = NSLock()
    /// Actions the core has not fulfilled or failed yet.
    private var pending: [ProviderActionID: CXAction] = [:]
    /// The manager taking the system's actions, if a phone runs.
    private var listener: (id: UInt64, sink: AsyncStream<ProviderAction>.Continuation)?
    private var listeners: UInt64 = 0
    /// Calls reported inside PushKit's callback, which the core may report again when the same call
    /// arrives over signaling first: the system has them already.
    private var reportedByPush: Set<UUID> = []

    public init(configuration: Configuration = Configuration()) {
        let system = CXProviderConfiguration()
        system.ringtoneSound = configuration.ringtoneSound
        system.iconTemplateImageData = configuration.iconTemplateImageData
        system.supportsVideo = configuration.supportsVideo
        system.maximumCallGroups = configuration.maximumCallGroups
        system.maximumCallsPerCallGroup = configuration.maximumCallsPerCallGroup
        system.includesCallsInRecents = configuration.includesCallsInRecents
        system.supportedHandleTypes = [.generic]
        provider = CXProvider(configuration: system)
        super.init()
        provider.setDelegate(self, queue: queue)
    }

    /// What the system asks of the app, in order: a new stream for each `CallManager.run()` (one per
    /// signed-in phone). The newest takes every action; an older one ends, and the actions it left
    /// open fail, since no one will complete them.
    public var actions: AsyncStream<ProviderAction> {
        let (stream, sink) = AsyncStream.makeStream(of: ProviderAction.self)
        let (id, previous, open) = lock.withLock { () -> (UInt64, AsyncStream<ProviderAction>.Continuation?, [CXAction]) in
            listeners += 1
            defer { listener = (listeners, sink); pending = [:] }
            return (listeners, listener?.sink, Array(pending.values))
        }
        previous?.finish()
        for action in open { action.fail() }
        sink.onTermination = { [weak self] _ in self?.detach(id) }
        return stream
    }

    private func detach(_ id: UInt64) {
        let open = lock.withLock { () -> [CXAction] in
            guard listener?.id == id else { return [] }
            listener = nil
            defer { pending = [:] }
            return Array(pending.values)
        }
        for action in open { action.fail() }
    }

    /// Reports a VoIP push's call from inside PushKit's callback, and ends it at once when
    /// `endAtOnce` says so, then calls `completion` with whether a phone is to take it (reported,
    /// and not ended).
    func reportPushedCall(_ push: VoIPPushReport, completion: @escaping @Sendable (Bool) -> Void) {
        let call = push.report.call
        lock.withLock { _ = reportedByPush.insert(call) }
        provider.reportNewIncomingCall(with: call, update: Self.update(for: push.report)) { [self] error in
            if let reason = push.endAtOnce {
                provider.reportCall(with: call, endedAt: Date(), reason: Self.endedReason(reason))
            }
            if error != nil || push.endAtOnce != nil { lock.withLock { _ = reportedByPush.remove(call) } }
            completion(error == nil && push.endAtOnce == nil)
        }
    }

    // MARK: The app asks the system

    /// Starts a call to `user` through CallKit (it then performs the start action); answers the call's UUID.
    public func startCall(to user: UserID, video: Bool = false) async throws -> UUID {
        let call = UUID()
        let start = CXStartCallAction(call: call, handle: CXHandle(type: .generic, value: user.rawValue))
        start.isVideo = video
        try await request(start)
        return call
    }

    public func answer(_ call: UUID) async throws { try await request(CXAnswerCallAction(call: call)) }
    public func end(_ call: UUID) async throws { try await request(CXEndCallAction(call: call)) }
    public func setMuted(_ call: UUID, _ muted: Bool) async throws { try await request(CXSetMutedCallAction(call: call, muted: muted)) }
    public func setHeld(_ call: UUID, _ held: Bool) async throws { try await request(CXSetHeldCallAction(call: call, onHold: held)) }

    public func playDTMF(_ call: UUID, digits: String) async throws {
        try await request(CXPlayDTMFCallAction(call: call, digits: digits, type: .singleTone))
    }

    /// The completion-handler form, whose closure carries only Sendable values: CallKit's classes
    /// are not Sendable, so its `async` imports cannot be called from here under Swift 6.
    private func request(_ action: CXAction) async throws {
        let transaction = CXTransaction(action: action)
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            controller.request(transaction) { error in continuation.resume(with: error.map { .failure($0) } ?? .success(())) }
        }
    }

    // MARK: SystemCallProvider

    public func reportIncomingCall(_ report: IncomingCallReport) async throws {
        // Reported already, by PushKit's callback, before signaling brought the same call here.
        guard lock.withLock({ reportedByPush.remove(report.call) }) == nil else { return }
        let update = Self.update(for: report)
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            provider.reportNewIncomingCall(with: report.call, update: update) { error in
                continuation.resume(with: error.map { .failure($0) } ?? .success(()))
            }
        }
    }

    static func update(for report: IncomingCallReport) -> CXCallUpdate {
        let update = CXCallUpdate()
        update.remoteHandle = CXHandle(type: .generic, value: report.caller.rawValue)
        // On a LAN the name is the caller's own choice: the incoming call screen shows where it comes from too.
        let name = report.callerName ?? report.caller.rawValue
        update.localizedCallerName = report.callerAddress.map { "\(name) (\($0))" } ?? name
        update.hasVideo = report.video
        update.supportsHolding = true
        update.supportsGrouping = false
        update.supportsUngrouping = false
        update.supportsDTMF = true
        return update
    }

    public func reportOutgoingCallStartedConnecting(_ call: UUID) async {
        provider.reportOutgoingCall(with: call, startedConnectingAt: Date())
    }

    public func reportOutgoingCallConnected(_ call: UUID) async {
        provider.reportOutgoingCall(with: call, connectedAt: Date())
    }

    public func reportCallEnded(_ call: UUID, reason: SystemEndReason) async {
        lock.withLock { _ = reportedByPush.remove(call) }
        provider.reportCall(with: call, endedAt: Date(), reason: Self.endedReason(reason))
    }

    public func fulfill(_ action: ProviderActionID) async {
        let now = Date()
        switch take(action) {
        case let start as CXStartCallAction: start.fulfill(withDateStarted: now)
        case let answer as CXAnswerCallAction: answer.fulfill(withDateConnected: now)
        case let end as CXEndCallAction: end.fulfill(withDateEnded: now)
        case let other?: other.fulfill()
        case nil: break
        }
    }

    public func fail(_ action: ProviderActionID) async {
        take(action)?.fail()
    }

    static func endedReason(_ reason: SystemEndReason) -> CXCallEndedReason {
        switch reason {
        case .failed: .failed
        case .remoteEnded: .remoteEnded
        case .unanswered: .unanswered
        case .answeredElsewhere: .answeredElsewhere
        case .declinedElsewhere: .declinedElsewhere
        }
    }

    // MARK: CXProviderDelegate

    public func providerDidReset(_ provider: CXProvider) {
        // The system forgot every call and every action; so does the adapter, and the core ends its calls.
        lock.withLock { pending = [:] }
        deliver(.reset)
    }

    public func provider(_ provider: CXProvider, perform action: CXStartCallAction) {
        guard let user = UserID(rawValue: action.handle.value) else {
            action.fail()  // not a Parley user id: nobody to call
            return
        }
        deliver(action) { .start($0, call: action.callUUID, to: user, video: action.isVideo) }
    }

    public func provider(_ provider: CXProvider, perform action: CXAnswerCallAction) {
        deliver(action) { .answer($0, call: action.callUUID) }
    }

    public func provider(_ provider: CXProvider, perform action: CXEndCallAction) {
        deliver(action) { .end($0, call: action.callUUID) }
    }

    public func provider(_ provider: CXProvider, perform action: CXSetHeldCallAction) {
        deliver(action) { .setHeld($0, call: action.callUUID, held: action.isOnHold) }
    }

    public func provider(_ provider: CXProvider, perform action: CXSetMutedCallAction) {
        deliver(action) { .setMuted($0, call: action.callUUID, muted: action.isMuted) }
    }

    public func provider(_ provider: CXProvider, perform action: CXPlayDTMFCallAction) {
        deliver(action) { .playDTMF($0, call: action.callUUID, digits: action.digits) }
    }

    public func provider(_ provider: CXProvider, timedOutPerforming action: CXAction) {
        let id = ProviderActionID(action.uuid)
        guard take(id) != nil else { return }
        deliver(.timedOut(id))
    }

    public func provider(_ provider: CXProvider, didActivate audioSession: AVAudioSession) {
        deliver(.audioSessionActivated)
    }

    public func provider(_ provider: CXProvider, didDeactivate audioSession: AVAudioSession) {
        deliver(.audioSessionDeactivated)
    }

    // MARK: Pending actions

    /// Holds `action` open for the running phone's core, or fails it when no phone runs.
    private func deliver(_ action: CXAction, as event: (ProviderActionID) -> ProviderAction) {
        let id = ProviderActionID(action.uuid)
        let sink = lock.withLock { () -> AsyncStream<ProviderAction>.Continuation? in
            guard let sink = listener?.sink else { return nil }
            pending[id] = action
            return sink
        }
        guard let sink else { return action.fail() }
        sink.yield(event(id))
    }

    private func deliver(_ event: ProviderAction) {
        _ = lock.withLock { listener?.sink }?.yield(event)
    }

    @discardableResult
    private func take(_ id: ProviderActionID) -> CXAction? {
        lock.withLock { pending.removeValue(forKey: id) }
    }
}
#endif
