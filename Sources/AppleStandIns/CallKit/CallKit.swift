// Stand-in for Apple's CallKit on Linux: only the declarations ParleyApple uses, transcribed from the
// iOS SDK headers, CallKit.framework/Headers/<the file named above each declaration>, in the Swift
// spelling the headers and CallKit's API notes import as — checked against the iOS 16.5 SDK mirrored
// in theos/sdks@4af4cb1d (the newest copy reachable here; every declaration used is in it). Apple platforms use the real framework; this module
// exists only in the Linux build (Package.swift; docs/apple-stand-ins.md lists where it cannot match).
//
// It behaves as the system does where a test can observe it: a call UUID is reported once; an
// answer, end, hold or mute names a call the system knows; an action completes once; requests go to
// the app's provider. The hooks a test uses to play the system are marked "Stand-in only".

import AVFAudio
import Foundation
import StandInSupport

// MARK: CXHandle.h

/// `@interface CXHandle : NSObject <NSCopying, NSSecureCoding>`
open class CXHandle: NSObject {
    /// `typedef NS_ENUM(NSInteger, CXHandleType)` — imported as `CXHandle.HandleType`.
    public enum HandleType: Int, Sendable {
        case generic = 1
        case phoneNumber = 2
        case emailAddress = 3
    }

    open private(set) var type: HandleType
    open private(set) var value: String

    /// `- (instancetype)initWithType:(CXHandleType)type value:(NSString *)value NS_DESIGNATED_INITIALIZER;`
    public init(type: HandleType, value: String) {
        self.type = type
        self.value = value
    }
}

// MARK: CXCallUpdate.h

/// `@interface CXCallUpdate : NSObject <NSCopying>`
open class CXCallUpdate: NSObject {
    open var remoteHandle: CXHandle?
    open var localizedCallerName: String?
    open var supportsHolding = false
    open var supportsGrouping = false
    open var supportsUngrouping = false
    open var supportsDTMF = false
    open var hasVideo = false

    override public init() {}
}

// MARK: CXAction.h

/// `@interface CXAction : NSObject <NSCopying, NSSecureCoding>`
open class CXAction: NSObject {
    private let lock = NSLock()
    private var outcome: StandInOutcome?
    /// `@property (nonatomic, readonly, copy) NSUUID *UUID;`
    open private(set) var uuid = UUID()
    /// `@property (nonatomic, readonly, assign, getter=isComplete) BOOL complete;`
    open var isComplete: Bool { lock.withLock { outcome != nil } }

    override public init() {}

    /// `- (void)fulfill;`
    open func fulfill() { complete(.fulfilled) }
    /// `- (void)fail;`
    open func fail() { complete(.failed) }

    // MARK: Stand-in only

    public enum StandInOutcome: Equatable, Sendable {
        case fulfilled
        case failed
    }

    /// How the app completed the action; nil while it is open. A second completion is ignored, as
    /// CallKit ignores it.
    public var standInOutcome: StandInOutcome? { lock.withLock { outcome } }

    func complete(_ result: StandInOutcome) {
        let first = lock.withLock { () -> Bool in
            guard outcome == nil else { return false }
            outcome = result
            return true
        }
        if first { standInCompleted?(self, result) }
    }

    /// Set by the provider that delivered the action: what the system does when it completes.
    var standInCompleted: ((CXAction, StandInOutcome) -> Void)?
}

// MARK: CXCallAction.h

/// `@interface CXCallAction : CXAction`
open class CXCallAction: CXAction {
    /// `@property (nonatomic, copy, readonly) NSUUID *callUUID;`
    open private(set) var callUUID: UUID

    /// `- (instancetype)initWithCallUUID:(NSUUID *)callUUID NS_DESIGNATED_INITIALIZER;`
    public init(call callUUID: UUID) {
        self.callUUID = callUUID
    }
}

// MARK: CXStartCallAction.h

/// `@interface CXStartCallAction : CXCallAction`
open class CXStartCallAction: CXCallAction {
    /// `@property (nonatomic, copy) CXHandle *handle;`
    open var handle: CXHandle
    /// `@property (nonatomic, getter=isVideo) BOOL video;`
    open var isVideo = false

    /// `- (instancetype)initWithCallUUID:(NSUUID *)callUUID handle:(CXHandle *)handle NS_DESIGNATED_INITIALIZER;`
    public init(call callUUID: UUID, handle: CXHandle) {
        self.handle = handle
        super.init(call: callUUID)
    }

    /// `- (void)fulfillWithDateStarted:(NSDate *)dateStarted;`
    open func fulfill(withDateStarted dateStarted: Date) { fulfill() }
}

// MARK: CXAnswerCallAction.h

/// `@interface CXAnswerCallAction : CXCallAction`
open class CXAnswerCallAction: CXCallAction {
    /// `- (void)fulfillWithDateConnected:(NSDate *)dateConnected;`
    open func fulfill(withDateConnected dateConnected: Date) { fulfill() }
}

// MARK: CXEndCallAction.h

/// `@interface CXEndCallAction : CXCallAction`
open class CXEndCallAction: CXCallAction {
    /// `- (void)fulfillWithDateEnded:(NSDate *)dateEnded;`
    open func fulfill(withDateEnded dateEnded: Date) { fulfill() }
}

// MARK: CXSetHeldCallAction.h

/// `@interface CXSetHeldCallAction : CXCallAction`
open class CXSetHeldCallAction: CXCallAction {
    /// `@property (nonatomic, getter=isOnHold) BOOL onHold;`
    open var isOnHold: Bool

    /// `- (instancetype)initWithCallUUID:(NSUUID *)callUUID onHold:(BOOL)onHold NS_DESIGNATED_INITIALIZER;`
    public init(call callUUID: UUID, onHold: Bool) {
        isOnHold = onHold
        super.init(call: callUUID)
    }
}

// MARK: CXSetMutedCallAction.h

/// `@interface CXSetMutedCallAction : CXCallAction`
open class CXSetMutedCallAction: CXCallAction {
    /// `@property (nonatomic, getter=isMuted) BOOL muted;`
    open var isMuted: Bool

    /// `- (instancetype)initWithCallUUID:(NSUUID *)callUUID muted:(BOOL)muted NS_DESIGNATED_INITIALIZER;`
    public init(call callUUID: UUID, muted: Bool) {
        isMuted = muted
        super.init(call: callUUID)
    }
}

// MARK: CXPlayDTMFCallAction.h

/// `@interface CXPlayDTMFCallAction : CXCallAction`
open class CXPlayDTMFCallAction: CXCallAction {
    /// `typedef NS_ENUM(NSInteger, CXPlayDTMFCallActionType)` — imported as `CXPlayDTMFCallAction.ActionType`.
    public enum ActionType: Int, Sendable {
        case singleTone = 1
        case softPause = 2
        case hardPause = 3
    }

    /// `@property (nonatomic, copy) NSString *digits;`
    open var digits: String
    /// `@property (nonatomic) CXPlayDTMFCallActionType type;`
    open var type: ActionType

    /// `- (instancetype)initWithCallUUID:(NSUUID *)callUUID digits:(NSString *)digits type:(CXPlayDTMFCallActionType)type NS_DESIGNATED_INITIALIZER;`
    public init(call callUUID: UUID, digits: String, type: ActionType) {
        self.digits = digits
        self.type = type
        super.init(call: callUUID)
    }
}

// MARK: CXTransaction.h

/// `@interface CXTransaction : NSObject <NSCopying, NSSecureCoding>`
open class CXTransaction: NSObject {
    open private(set) var actions: [CXAction]
    open private(set) var uuid = UUID()

    /// `- (instancetype)initWithActions:(NSArray<CXAction *> *)actions NS_DESIGNATED_INITIALIZER;`
    public init(actions: [CXAction]) { self.actions = actions }
    /// `- (instancetype)initWithAction:(CXAction *)action;`
    public convenience init(action: CXAction) { self.init(actions: [action]) }
}

// MARK: CXError.h

/// `CXErrorDomainIncomingCall` codes — imported as `CXErrorCodeIncomingCallError.Code`.
public struct CXErrorCodeIncomingCallError: Error, Equatable, Sendable {
    public enum Code: Int, Sendable {
        case unknown = 0
        case unentitled = 1
        case callUUIDAlreadyExists = 2
        case filteredByDoNotDisturb = 3
        case filteredByBlockList = 4
    }

    public let code: Code
    public init(_ code: Code) { self.code = code }
}

/// `CXErrorDomainRequestTransaction` codes — imported as `CXErrorCodeRequestTransactionError.Code`.
public struct CXErrorCodeRequestTransactionError: Error, Equatable, Sendable {
    public enum Code: Int, Sendable {
        case unknown = 0
        case unentitled = 1
        case unknownCallProvider = 2
        case emptyTransaction = 3
        case unknownCallUUID = 4
        case callUUIDAlreadyExists = 5
        case invalidAction = 6
        case maximumCallGroupsReached = 7
    }

    public let code: Code
    public init(_ code: Code) { self.code = code }
}

// MARK: CXProviderConfiguration.h

/// `@interface CXProviderConfiguration : NSObject <NSCopying>`
open class CXProviderConfiguration: NSObject {
    /// `@property (nonatomic, strong, nullable) NSString *ringtoneSound;`
    open var ringtoneSound: String?
    /// `@property (nonatomic, copy, nullable) NSData *iconTemplateImageData;`
    open var iconTemplateImageData: Data?
    /// `@property (nonatomic) NSUInteger maximumCallGroups;` (default 2)
    open var maximumCallGroups = 2
    /// `@property (nonatomic) NSUInteger maximumCallsPerCallGroup;` (default 5)
    open var maximumCallsPerCallGroup = 5
    /// `@property (nonatomic) BOOL includesCallsInRecents;` (iOS 11, default YES)
    open var includesCallsInRecents = true
    /// `@property (nonatomic) BOOL supportsVideo;`
    open var supportsVideo = false
    /// `@property (nonatomic, copy) NSSet<NSNumber *> *supportedHandleTypes;`
    open var supportedHandleTypes: Set<CXHandle.HandleType> = []

    /// `- (instancetype)init API_AVAILABLE(ios(14.0));` — the localized name comes from the bundle.
    override public init() {}
}

// MARK: CXProvider.h

/// `typedef NS_ENUM(NSInteger, CXCallEndedReason)`
public enum CXCallEndedReason: Int, Sendable {
    case failed = 1
    case remoteEnded = 2
    case unanswered = 3
    case answeredElsewhere = 4
    case declinedElsewhere = 5
}

/// `@protocol CXProviderDelegate <NSObject>`: `providerDidReset:` is required, the rest `@optional`.
/// Swift cannot declare optional requirements without Objective-C, so the optional ones have empty
/// defaults here; an adapter method whose signature drifts would silently get the default — which
/// the adapter tests catch, since they drive every method through this protocol.
public protocol CXProviderDelegate: NSObjectProtocol {
    /// `- (void)providerDidReset:(CXProvider *)provider;`
    func providerDidReset(_ provider: CXProvider)
    /// `- (void)providerDidBegin:(CXProvider *)provider;`
    func providerDidBegin(_ provider: CXProvider)
    /// `- (void)provider:(CXProvider *)provider performStartCallAction:(CXStartCallAction *)action;`
    func provider(_ provider: CXProvider, perform action: CXStartCallAction)
    /// `- (void)provider:(CXProvider *)provider performAnswerCallAction:(CXAnswerCallAction *)action;`
    func provider(_ provider: CXProvider, perform action: CXAnswerCallAction)
    /// `- (void)provider:(CXProvider *)provider performEndCallAction:(CXEndCallAction *)action;`
    func provider(_ provider: CXProvider, perform action: CXEndCallAction)
    /// `- (void)provider:(CXProvider *)provider performSetHeldCallAction:(CXSetHeldCallAction *)action;`
    func provider(_ provider: CXProvider, perform action: CXSetHeldCallAction)
    /// `- (void)provider:(CXProvider *)provider performSetMutedCallAction:(CXSetMutedCallAction *)action;`
    func provider(_ provider: CXProvider, perform action: CXSetMutedCallAction)
    /// `- (void)provider:(CXProvider *)provider performPlayDTMFCallAction:(CXPlayDTMFCallAction *)action;`
    func provider(_ provider: CXProvider, perform action: CXPlayDTMFCallAction)
    /// `- (void)provider:(CXProvider *)provider timedOutPerformingAction:(CXAction *)action;`
    func provider(_ provider: CXProvider, timedOutPerforming action: CXAction)
    /// `- (void)provider:(CXProvider *)provider didActivateAudioSession:(AVAudioSession *)audioSession;`
    func provider(_ provider: CXProvider, didActivate audioSession: AVAudioSession)
    /// `- (void)provider:(CXProvider *)provider didDeactivateAudioSession:(AVAudioSession *)audioSession;`
    func provider(_ provider: CXProvider, didDeactivate audioSession: AVAudioSession)
}

extension CXProviderDelegate {
    public func providerDidBegin(_ provider: CXProvider) {}
    public func provider(_ provider: CXProvider, perform action: CXStartCallAction) { action.fail() }
    public func provider(_ provider: CXProvider, perform action: CXAnswerCallAction) { action.fail() }
    public func provider(_ provider: CXProvider, perform action: CXEndCallAction) { action.fail() }
    public func provider(_ provider: CXProvider, perform action: CXSetHeldCallAction) { action.fail() }
    public func provider(_ provider: CXProvider, perform action: CXSetMutedCallAction) { action.fail() }
    public func provider(_ provider: CXProvider, perform action: CXPlayDTMFCallAction) { action.fail() }
    public func provider(_ provider: CXProvider, timedOutPerforming action: CXAction) {}
    public func provider(_ provider: CXProvider, didActivate audioSession: AVAudioSession) {}
    public func provider(_ provider: CXProvider, didDeactivate audioSession: AVAudioSession) {}
}

/// `@interface CXProvider : NSObject`
open class CXProvider: NSObject {
    /// `@property (nonatomic, readwrite, copy) CXProviderConfiguration *configuration;`
    open var configuration: CXProviderConfiguration
    private let lock = NSLock()
    private weak var delegate: (any CXProviderDelegate)?
    private var queue: DispatchQueue?
    private var calls: [UUID: StandInCall] = [:]
    private var reports: [StandInReport] = []
    /// Actions the system handed the delegate that it has neither fulfilled nor failed (nor the
    /// system timed out): on a device CallKit times each out, and a start or answer left open fails its call.
    private var openActions: [ObjectIdentifier: CXAction] = [:]
    private var refusal: CXErrorCodeIncomingCallError.Code?
    private var invalidated = false

    /// `- (instancetype)initWithConfiguration:(CXProviderConfiguration *)configuration NS_DESIGNATED_INITIALIZER;`
    public init(configuration: CXProviderConfiguration) {
        self.configuration = configuration
        super.init()
        Self.registry.withLock { $0 = self }
        Self.connected.withLock { $0 += 1 }
    }

    /// `- (void)setDelegate:(nullable id<CXProviderDelegate>)delegate queue:(nullable dispatch_queue_t)queue;`
    open func setDelegate(_ delegate: (any CXProviderDelegate)?, queue: DispatchQueue?) {
        lock.withLock {
            self.delegate = delegate
            self.queue = queue
        }
    }

    /// `- (void)reportNewIncomingCallWithUUID:(NSUUID *)UUID update:(CXCallUpdate *)update
    ///    completion:(void (^)(NSError *_Nullable error))completion;`
    /// A UUID the system knows already is refused (`callUUIDAlreadyExists`), as is any call after a
    /// test set a refusal (Do Not Disturb, a blocked caller).
    open func reportNewIncomingCall(with uuid: UUID, update: CXCallUpdate, completion: @escaping @Sendable ((any Error)?) -> Void) {
        let error: CXErrorCodeIncomingCallError? = lock.withLock {
            if let refusal {
                self.refusal = nil
                return CXErrorCodeIncomingCallError(refusal)
            }
            if calls[uuid] != nil { return CXErrorCodeIncomingCallError(.callUUIDAlreadyExists) }
            calls[uuid] = StandInCall(incoming: true)
            reports.append(.incoming(uuid, update.localizedCallerName, update.remoteHandle?.value, video: update.hasVideo))
            return nil
        }
        // What PushKit checks is that the app called this, refused or not (Apple's DTS: reporting a
        // push's call under the UUID of a call the app has already fails, and that is fine).
        Self.incomingReports.withLock { $0 += 1 }
        deliver { completion(error) }
    }

    /// The `async throws` form Swift imports for the completion-handler method.
    open func reportNewIncomingCall(with uuid: UUID, update: CXCallUpdate) async throws {
        let error: (any Error)? = await withCheckedContinuation { continuation in
            reportNewIncomingCall(with: uuid, update: update) { continuation.resume(returning: $0) }
        }
        if let error { throw error }
    }

    /// `- (void)reportCallWithUUID:(NSUUID *)UUID updated:(CXCallUpdate *)update;`
    open func reportCall(with uuid: UUID, updated update: CXCallUpdate) {
        lock.withLock { reports.append(.updated(uuid, video: update.hasVideo)) }
    }

    /// `- (void)reportCallWithUUID:(NSUUID *)UUID endedAtDate:(nullable NSDate *)dateEnded reason:(CXCallEndedReason)endedReason;`
    open func reportCall(with uuid: UUID, endedAt dateEnded: Date?, reason endedReason: CXCallEndedReason) {
        lock.withLock {
            calls[uuid] = nil
            reports.append(.ended(uuid, endedReason))
        }
    }

    /// `- (void)reportOutgoingCallWithUUID:(NSUUID *)UUID startedConnectingAtDate:(nullable NSDate *)dateStartedConnecting;`
    open func reportOutgoingCall(with uuid: UUID, startedConnectingAt dateStartedConnecting: Date?) {
        lock.withLock { reports.append(.outgoingStartedConnecting(uuid)) }
    }

    /// `- (void)reportOutgoingCallWithUUID:(NSUUID *)UUID connectedAtDate:(nullable NSDate *)dateConnected;`
    open func reportOutgoingCall(with uuid: UUID, connectedAt dateConnected: Date?) {
        lock.withLock { reports.append(.outgoingConnected(uuid)) }
    }

    /// `- (void)invalidate;`
    /// The system forgets the provider: its calls end, and it takes no more reports.
    open func invalidate() {
        let first = lock.withLock { () -> Bool in
            defer { invalidated = true }
            return !invalidated
        }
        if first { Self.connected.withLock { $0 -= 1 } }
    }

    private func deliver(_ work: @escaping @Sendable () -> Void) {
        if let queue = lock.withLock({ self.queue }) { queue.async(execute: work) } else { DispatchQueue.main.async(execute: work) }
    }

    // MARK: Stand-in only

    /// What the app reported to the system, in order.
    public enum StandInReport: Equatable, Sendable {
        case incoming(UUID, String?, String?, video: Bool)
        case updated(UUID, video: Bool)
        case outgoingStartedConnecting(UUID)
        case outgoingConnected(UUID)
        case ended(UUID, CXCallEndedReason)
    }

    struct StandInCall {
        var incoming: Bool
    }

    public var standInReports: [StandInReport] { lock.withLock { reports } }
    /// Calls the system knows now (reported, or started and not ended).
    public var standInCalls: Set<UUID> { lock.withLock { Set(calls.keys) } }
    /// Actions performed and not yet fulfilled or failed (nor timed out by `standInTimeOut`).
    public var standInOpenActions: [CXAction] { lock.withLock { Array(openActions.values) } }

    /// The next incoming report is refused with `code` (Do Not Disturb, a blocked caller…).
    public func standInRefuseNextIncomingCall(_ code: CXErrorCodeIncomingCallError.Code) {
        lock.withLock { refusal = code }
    }

    /// The system performs `action` (the user pressed a button, or the app requested a transaction):
    /// the delegate gets it on its queue. Answers what the system would refuse instead.
    @discardableResult
    public func standInPerform(_ action: CXAction) -> CXErrorCodeRequestTransactionError? {
        let refusal: CXErrorCodeRequestTransactionError? = lock.withLock {
            guard let callAction = action as? CXCallAction else { return CXErrorCodeRequestTransactionError(.invalidAction) }
            if action is CXStartCallAction {
                if calls[callAction.callUUID] != nil { return CXErrorCodeRequestTransactionError(.callUUIDAlreadyExists) }
                calls[callAction.callUUID] = StandInCall(incoming: false)
                return nil
            }
            return calls[callAction.callUUID] == nil ? CXErrorCodeRequestTransactionError(.unknownCallUUID) : nil
        }
        if let refusal { return refusal }
        lock.withLock { openActions[ObjectIdentifier(action)] = action }
        action.standInCompleted = { [weak self] action, outcome in
            guard let self else { return }
            _ = self.lock.withLock { self.openActions.removeValue(forKey: ObjectIdentifier(action)) }
            guard let callAction = action as? CXCallAction else { return }
            // A failed start, or a completed end, leaves the system without the call.
            if (action is CXStartCallAction && outcome == .failed) || action is CXEndCallAction {
                _ = self.lock.withLock { self.calls.removeValue(forKey: callAction.callUUID) }
            }
        }
        let boxed = StandInUnchecked(action)  // the system hands the action to the delegate's queue
        withDelegate { provider, delegate in
            switch boxed.value {
            case let start as CXStartCallAction: delegate.provider(provider, perform: start)
            case let answer as CXAnswerCallAction: delegate.provider(provider, perform: answer)
            case let end as CXEndCallAction: delegate.provider(provider, perform: end)
            case let held as CXSetHeldCallAction: delegate.provider(provider, perform: held)
            case let muted as CXSetMutedCallAction: delegate.provider(provider, perform: muted)
            case let dtmf as CXPlayDTMFCallAction: delegate.provider(provider, perform: dtmf)
            default: boxed.value.fail()
            }
        }
        return nil
    }

    /// The system gave up waiting for `action` (it stays open too long).
    public func standInTimeOut(_ action: CXAction) {
        _ = lock.withLock { openActions.removeValue(forKey: ObjectIdentifier(action)) }
        let boxed = StandInUnchecked(action)
        withDelegate { provider, delegate in delegate.provider(provider, timedOutPerforming: boxed.value) }
    }

    /// The system activated the call's audio session (after an answer or start action was fulfilled).
    public func standInActivateAudioSession() {
        AVAudioSession.sharedInstance().standInSystemSetActive(true)
        withDelegate { provider, delegate in delegate.provider(provider, didActivate: AVAudioSession.sharedInstance()) }
    }

    public func standInDeactivateAudioSession() {
        AVAudioSession.sharedInstance().standInSystemSetActive(false)
        withDelegate { provider, delegate in delegate.provider(provider, didDeactivate: AVAudioSession.sharedInstance()) }
    }

    /// The system reset the provider (the call service crashed): every call is gone.
    public func standInReset() {
        lock.withLock { calls = [:] }
        withDelegate { provider, delegate in delegate.providerDidReset(provider) }
    }

    private func withDelegate(_ body: @escaping @Sendable (CXProvider, any CXProviderDelegate) -> Void) {
        let (delegate, queue) = lock.withLock { (self.delegate, self.queue) }
        guard let delegate else { return }
        let box = StandInUnchecked((self, delegate))
        (queue ?? .main).async { body(box.value.0, box.value.1) }
    }

    /// The app's provider, as the system knows it: where `CXCallController` requests go.
    static let registry = StandInLockedBox<CXProvider?>(nil)
    /// Providers the app made and did not invalidate: each stays connected to the system (Apple asks
    /// for one per app; a second one competes for the same calls).
    public static let connected = StandInLockedBox(0)
    /// Calls to `reportNewIncomingCall` by any provider so far, refused ones too (PushKit's
    /// stand-in checks that a push was reported).
    public static let incomingReports = StandInLockedBox(0)
}

// MARK: CXCallController.h

/// `@interface CXCallController : NSObject`
open class CXCallController: NSObject {
    /// `- (instancetype)init;`
    override public init() {}

    /// `- (void)requestTransaction:(CXTransaction *)transaction completion:(void (^)(NSError *_Nullable error))completion;`
    /// — imported as `request(_:completion:)`, and as `request(_:) async throws`.
    open func request(_ transaction: CXTransaction, completion: @escaping @Sendable ((any Error)?) -> Void) {
        guard let provider = CXProvider.registry.withLock({ $0 }) else {
            return completion(CXErrorCodeRequestTransactionError(.unknownCallProvider))
        }
        guard !transaction.actions.isEmpty else { return completion(CXErrorCodeRequestTransactionError(.emptyTransaction)) }
        for action in transaction.actions {
            if let refusal = provider.standInPerform(action) { return completion(refusal) }
        }
        completion(nil)
    }

    open func request(_ transaction: CXTransaction) async throws {
        let error: (any Error)? = await withCheckedContinuation { continuation in
            request(transaction) { continuation.resume(returning: $0) }
        }
        if let error { throw error }
    }
}
