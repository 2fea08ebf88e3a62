// Stand-in for Apple's PushKit on Linux: only the declarations ParleyApple uses, transcribed from the
// iOS SDK headers (checked against the iOS 16.5 SDK as mirrored in theos/sdks@4af4cb1d, the newest
// copy reachable here; every declaration used is in it, below the package's iOS 17 floor), PushKit.framework/Headers/PKPushRegistry.h, PKPushCredentials.h,
// PKPushPayload.h and PKDefines.h, in their Swift spelling. Apple platforms use the real framework.
//
// It checks iOS 13's rule as the system enforces it: an app that completes a VoIP push without
// having reported a call to CallKit is terminated (and, repeatedly, stops getting VoIP pushes).
// The hooks a test uses to play the system are marked "Stand-in only".

import CallKit
import Foundation
import StandInSupport

// MARK: PKDefines.h

/// `typedef NSString *PKPushType NS_STRING_ENUM;`
public struct PKPushType: RawRepresentable, Hashable, Sendable {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    /// `PK_EXPORT PKPushType const PKPushTypeVoIP;`
    public static let voIP = PKPushType(rawValue: "PKPushTypeVoIP")
}

// MARK: PKPushCredentials.h

/// `@interface PKPushCredentials : NSObject`
open class PKPushCredentials: NSObject {
    /// `@property (readonly, copy) PKPushType type;`
    open private(set) var type: PKPushType
    /// `@property (readonly, copy) NSData *token;`
    open private(set) var token: Data

    /// Stand-in only: credentials come from the system.
    public init(standInType type: PKPushType, token: Data) {
        self.type = type
        self.token = token
    }
}

// MARK: PKPushPayload.h

/// `@interface PKPushPayload : NSObject`
open class PKPushPayload: NSObject {
    /// `@property (readonly, copy) PKPushType type;`
    open private(set) var type: PKPushType
    /// `@property (readonly, copy) NSDictionary *dictionaryPayload;`
    open private(set) var dictionaryPayload: [AnyHashable: Any]

    /// Stand-in only: payloads come from the system.
    public init(standInType type: PKPushType, dictionaryPayload: [AnyHashable: Any]) {
        self.type = type
        self.dictionaryPayload = dictionaryPayload
    }
}

// MARK: PKPushRegistry.h

/// `@protocol PKPushRegistryDelegate <NSObject>`: `didUpdatePushCredentials:forType:` is required;
/// `didReceiveIncomingPushWithPayload:forType:withCompletionHandler:` (iOS 11) and
/// `didInvalidatePushTokenForType:` are `@optional`, given empty defaults here (see CallKit's note).
public protocol PKPushRegistryDelegate: NSObjectProtocol {
    /// `- (void)pushRegistry:(PKPushRegistry *)registry didUpdatePushCredentials:(PKPushCredentials *)pushCredentials forType:(PKPushType)type;`
    func pushRegistry(_ registry: PKPushRegistry, didUpdate pushCredentials: PKPushCredentials, for type: PKPushType)
    /// `- (void)pushRegistry:(PKPushRegistry *)registry didReceiveIncomingPushWithPayload:(PKPushPayload *)payload
    ///    forType:(PKPushType)type withCompletionHandler:(void(^)(void))completion;`
    func pushRegistry(_ registry: PKPushRegistry, didReceiveIncomingPushWith payload: PKPushPayload, for type: PKPushType,
                      completion: @escaping () -> Void)
    /// `- (void)pushRegistry:(PKPushRegistry *)registry didInvalidatePushTokenForType:(PKPushType)type;`
    func pushRegistry(_ registry: PKPushRegistry, didInvalidatePushTokenFor type: PKPushType)
}

extension PKPushRegistryDelegate {
    public func pushRegistry(_ registry: PKPushRegistry, didReceiveIncomingPushWith payload: PKPushPayload, for type: PKPushType,
                             completion: @escaping () -> Void) { completion() }
    public func pushRegistry(_ registry: PKPushRegistry, didInvalidatePushTokenFor type: PKPushType) {}
}

/// `@interface PKPushRegistry : NSObject`
open class PKPushRegistry: NSObject {
    private let lock = NSLock()
    private let queue: DispatchQueue?
    private weak var _delegate: (any PKPushRegistryDelegate)?
    private var _desiredPushTypes: Set<PKPushType>?
    private var tokens: [PKPushType: Data] = [:]
    private var atCompletion: (@Sendable () -> Void)?

    /// `@property (readwrite, weak, nullable) id<PKPushRegistryDelegate> delegate;`
    open weak var delegate: (any PKPushRegistryDelegate)? {
        get { lock.withLock { _delegate } }
        set { lock.withLock { _delegate = newValue } }
    }

    /// `@property (readwrite, copy, nullable) NSSet<PKPushType> *desiredPushTypes;`
    open var desiredPushTypes: Set<PKPushType>? {
        get { lock.withLock { _desiredPushTypes } }
        set { lock.withLock { _desiredPushTypes = newValue } }
    }

    /// `- (instancetype)initWithQueue:(nullable dispatch_queue_t)queue NS_DESIGNATED_INITIALIZER;`
    public init(queue: DispatchQueue?) {
        self.queue = queue
        super.init()
    }

    /// `- (nullable NSData *)pushTokenForType:(PKPushType)type;`
    open func pushToken(for type: PKPushType) -> Data? { lock.withLock { tokens[type] } }

    // MARK: Stand-in only

    /// What became of a push the system delivered.
    public enum StandInDelivery: Equatable, Sendable {
        /// The app reported a call to CallKit, then called the completion.
        case reportedThenCompleted
        /// The app called the completion without reporting a call: iOS 13 and later terminate it.
        case terminatedForNotReporting
        /// The app never called the completion within the wait.
        case neverCompleted
        /// The registry does not want VoIP pushes (`desiredPushTypes`), or has no delegate.
        case notDelivered
    }

    /// Runs as a push's completion is called (a test reads there what the app had told CallKit by then).
    public var standInAtCompletion: (@Sendable () -> Void)? {
        get { lock.withLock { atCompletion } }
        set { lock.withLock { atCompletion = newValue } }
    }

    /// The system issues (or renews) the device's push token.
    public func standInUpdateCredentials(token: Data, for type: PKPushType = .voIP) {
        lock.withLock { tokens[type] = token }
        guard desiredPushTypes?.contains(type) == true, let delegate else { return }
        let box = StandInUnchecked((self, delegate))
        (queue ?? .main).async {
            box.value.1.pushRegistry(box.value.0, didUpdate: PKPushCredentials(standInType: type, token: token), for: type)
        }
    }

    public func standInInvalidateToken(for type: PKPushType = .voIP) {
        lock.withLock { tokens[type] = nil }
        guard let delegate else { return }
        let box = StandInUnchecked((self, delegate))
        (queue ?? .main).async { box.value.1.pushRegistry(box.value.0, didInvalidatePushTokenFor: type) }
    }

    /// The system delivers a VoIP push, checks as the delegate method returns that the app called
    /// `reportNewIncomingCall` meanwhile (as PushKit does: a report made later, from another queue
    /// or a task, is too late, whenever the completion runs), then waits up to `timeout` for the
    /// completion.
    public func standInDeliver(_ payload: [AnyHashable: Any], timeout: Duration = .seconds(5)) async -> StandInDelivery {
        guard desiredPushTypes?.contains(.voIP) == true, let delegate else { return .notDelivered }
        let box = StandInUnchecked((self, delegate, PKPushPayload(standInType: .voIP, dictionaryPayload: payload)))
        return await withCheckedContinuation { continuation in
            let once = StandInLockedBox(false)
            let resume: @Sendable (StandInDelivery) -> Void = { value in
                guard once.withLock({ done in defer { done = true }; return !done }) else { return }
                continuation.resume(returning: value)
            }
            (queue ?? .main).async {
                let reportsBefore = CXProvider.incomingReports.withLock { $0 }
                // Whether the delegate method has returned, and whether the completion has run.
                let state = StandInLockedBox((returned: false, completed: false))
                let atCompletion = box.value.0.standInAtCompletion
                box.value.1.pushRegistry(box.value.0, didReceiveIncomingPushWith: box.value.2, for: .voIP) {
                    atCompletion?()
                    // After the check (a push found unreported has ended the app already).
                    if state.withLock({ state in state.completed = true; return state.returned }) { resume(.reportedThenCompleted) }
                }
                let completed = state.withLock { state in state.returned = true; return state.completed }
                if CXProvider.incomingReports.withLock({ $0 }) == reportsBefore {
                    resume(.terminatedForNotReporting)
                } else if completed {
                    resume(.reportedThenCompleted)
                }
            }
            Task {
                try? await Task.sleep(for: timeout)
                resume(.neverCompleted)
            }
        }
    }
}
