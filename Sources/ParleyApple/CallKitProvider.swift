import AVFAudio
import CallKit
import Foundation
import ParleyKit
import ParleyProtocol

/// The SDK's `SystemCallProvider` over CallKit: `CXProvider` for what the system shows and asks,
/// `CXCallController` for what the app asks of it. Thin by design: every action goes to the core
/// as a `ProviderAction`, and the core fulfils or fails it (apple-rules.md).
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

    public let actions: AsyncStream<ProviderAction>
    private let sink: AsyncStream<ProviderAction>.Continuation
    /// The system's provider (to report call updates the SDK does not make, e.g. a new caller name).
    public let provider: CXProvider
    private let controller = CXCallController()
    private let queue = DispatchQueue(label: "net.parley.callkit")
    private let lock = NSLock()
    /// Actions the core has not fulfilled or failed yet.
    private var pending: [ProviderActionID: CXAction] = [:]

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
        (actions, sink) = AsyncStream.makeStream()
        super.init()
        provider.setDelegate(self, queue: queue)
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
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            provider.reportNewIncomingCall(with: report.call, update: update) { error in
                continuation.resume(with: error.map { .failure($0) } ?? .success(()))
            }
        }
    }

    public func reportOutgoingCallStartedConnecting(_ call: UUID) async {
        provider.reportOutgoingCall(with: call, startedConnectingAt: Date())
    }

    public func reportOutgoingCallConnected(_ call: UUID) async {
        provider.reportOutgoingCall(with: call, connectedAt: Date())
    }

    public func reportCallEnded(_ call: UUID, reason: SystemEndReason) async {
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
        sink.yield(.reset)
    }

    public func provider(_ provider: CXProvider, perform action: CXStartCallAction) {
        guard let user = UserID(rawValue: action.handle.value) else {
            action.fail()  // not a Parley user id: nobody to call
            return
        }
        sink.yield(.start(hold(action), call: action.callUUID, to: user, video: action.isVideo))
    }

    public func provider(_ provider: CXProvider, perform action: CXAnswerCallAction) {
        sink.yield(.answer(hold(action), call: action.callUUID))
    }

    public func provider(_ provider: CXProvider, perform action: CXEndCallAction) {
        sink.yield(.end(hold(action), call: action.callUUID))
    }

    public func provider(_ provider: CXProvider, perform action: CXSetHeldCallAction) {
        sink.yield(.setHeld(hold(action), call: action.callUUID, held: action.isOnHold))
    }

    public func provider(_ provider: CXProvider, perform action: CXSetMutedCallAction) {
        sink.yield(.setMuted(hold(action), call: action.callUUID, muted: action.isMuted))
    }

    public func provider(_ provider: CXProvider, perform action: CXPlayDTMFCallAction) {
        sink.yield(.playDTMF(hold(action), call: action.callUUID, digits: action.digits))
    }

    public func provider(_ provider: CXProvider, timedOutPerforming action: CXAction) {
        let id = ProviderActionID(action.uuid)
        guard take(id) != nil else { return }
        sink.yield(.timedOut(id))
    }

    public func provider(_ provider: CXProvider, didActivate audioSession: AVAudioSession) {
        sink.yield(.audioSessionActivated)
    }

    public func provider(_ provider: CXProvider, didDeactivate audioSession: AVAudioSession) {
        sink.yield(.audioSessionDeactivated)
    }

    // MARK: Pending actions

    private func hold(_ action: CXAction) -> ProviderActionID {
        let id = ProviderActionID(action.uuid)
        lock.withLock { pending[id] = action }
        return id
    }

    @discardableResult
    private func take(_ id: ProviderActionID) -> CXAction? {
        lock.withLock { pending.removeValue(forKey: id) }
    }
}
