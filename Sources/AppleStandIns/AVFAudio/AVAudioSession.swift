// Stand-in for Apple's AVFAudio on Linux: only the declarations ParleyApple uses, transcribed from
// the iOS SDK headers (checked against the iOS 16.5 SDK in theos/sdks@4af4cb1d; `routeDisconnected`
// is iOS 17's), AVFAudio.framework/Headers/AVAudioSession.h,
// AVAudioSessionTypes.h and AVAudioSessionRoute.h, with the Swift spellings the headers import as
// (NS_SWIFT_NAME, NS_TYPED_EXTENSIBLE_ENUM → nested structs). Apple platforms use the real framework;
// this module exists only in the Linux build (see Package.swift and docs/apple-stand-ins.md).
//
// What a stand-in adds is marked "Stand-in only": the hooks a test uses to play the system.

import Foundation

// MARK: AVAudioSessionTypes.h

extension AVAudioSession {
    /// `typedef NSString *AVAudioSessionCategory NS_STRING_ENUM;`
    public struct Category: RawRepresentable, Hashable, Sendable {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        /// `AVAudioSessionCategoryPlayAndRecord`
        public static let playAndRecord = Category(rawValue: "AVAudioSessionCategoryPlayAndRecord")
        /// `AVAudioSessionCategorySoloAmbient` (the default)
        public static let soloAmbient = Category(rawValue: "AVAudioSessionCategorySoloAmbient")
    }

    /// `typedef NSString *AVAudioSessionMode NS_STRING_ENUM;`
    public struct Mode: RawRepresentable, Hashable, Sendable {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        /// `AVAudioSessionModeDefault`
        public static let `default` = Mode(rawValue: "AVAudioSessionModeDefault")
        /// `AVAudioSessionModeVoiceChat`
        public static let voiceChat = Mode(rawValue: "AVAudioSessionModeVoiceChat")
        /// `AVAudioSessionModeVideoChat`
        public static let videoChat = Mode(rawValue: "AVAudioSessionModeVideoChat")
    }

    /// `typedef NS_OPTIONS(NSUInteger, AVAudioSessionCategoryOptions)`
    public struct CategoryOptions: OptionSet, Hashable, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        /// `AVAudioSessionCategoryOptionMixWithOthers = 0x1`
        public static let mixWithOthers = CategoryOptions(rawValue: 0x1)
        /// `AVAudioSessionCategoryOptionDuckOthers = 0x2`
        public static let duckOthers = CategoryOptions(rawValue: 0x2)
        /// `AVAudioSessionCategoryOptionAllowBluetooth API_DEPRECATED_WITH_REPLACEMENT("AVAudioSessionCategoryOptionAllowBluetoothHFP", ...) = 0x4`
        /// (deprecated in the iOS 26 SDK; the only name before it)
        @available(*, deprecated, renamed: "allowBluetoothHFP")
        public static let allowBluetooth = CategoryOptions(rawValue: 0x4)
        /// `AVAudioSessionCategoryOptionAllowBluetoothHFP = 0x4` (the iOS 26 SDK's name)
        public static let allowBluetoothHFP = CategoryOptions(rawValue: 0x4)
        /// `AVAudioSessionCategoryOptionDefaultToSpeaker = 0x8`
        public static let defaultToSpeaker = CategoryOptions(rawValue: 0x8)
        /// `AVAudioSessionCategoryOptionAllowBluetoothA2DP = 0x20`
        public static let allowBluetoothA2DP = CategoryOptions(rawValue: 0x20)
    }

    /// `typedef NS_ENUM(NSUInteger, AVAudioSessionPortOverride)`
    public enum PortOverride: UInt, Sendable {
        case none = 0
        /// `'spkr'`
        case speaker = 0x73706b72
    }

    /// `typedef NS_ENUM(NSUInteger, AVAudioSessionRouteChangeReason)`
    public enum RouteChangeReason: UInt, Sendable {
        case unknown = 0
        case newDeviceAvailable = 1
        case oldDeviceUnavailable = 2
        case categoryChange = 3
        case override = 4
        case wakeFromSleep = 6
        case noSuitableRouteForCategory = 7
        case routeConfigurationChange = 8
    }

    /// `typedef NS_ENUM(NSUInteger, AVAudioSessionInterruptionType)`
    public enum InterruptionType: UInt, Sendable {
        case began = 1
        case ended = 0
    }

    /// `typedef NS_OPTIONS(NSUInteger, AVAudioSessionInterruptionOptions)`
    public struct InterruptionOptions: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        /// `AVAudioSessionInterruptionOptionShouldResume = 1`
        public static let shouldResume = InterruptionOptions(rawValue: 1)
    }

    /// `typedef NS_ENUM(NSUInteger, AVAudioSessionInterruptionReason)` (iOS 14.5), as the iOS 26.2 SDK
    /// declares it for iOS: 3 (`sceneWasBackgrounded`) and 5 exist on visionOS only.
    public enum InterruptionReason: UInt, Sendable {
        case `default` = 0
        /// `API_DEPRECATED("wasSuspended reason no longer present", ios(14.5, 16.0))`
        case appWasSuspended = 1
        case builtInMicMuted = 2
        /// `API_AVAILABLE(ios(17.0))`
        case routeDisconnected = 4
    }

    /// `typedef NS_OPTIONS(NSUInteger, AVAudioSessionSetActiveOptions)`
    public struct SetActiveOptions: OptionSet, Hashable, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        /// `AVAudioSessionSetActiveOptionNotifyOthersOnDeactivation = 1`: an app this session
        /// interrupted (music, a podcast) is told it may resume.
        public static let notifyOthersOnDeactivation = SetActiveOptions(rawValue: 1)
    }

    /// `typedef NSString *AVAudioSessionPort NS_STRING_ENUM;`
    public struct Port: RawRepresentable, Hashable, Sendable {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public static let builtInReceiver = Port(rawValue: "Receiver")
        public static let builtInSpeaker = Port(rawValue: "Speaker")
        public static let builtInMic = Port(rawValue: "MicrophoneBuiltIn")
        public static let headphones = Port(rawValue: "Headphones")
        public static let headsetMic = Port(rawValue: "MicrophoneWired")
        public static let bluetoothHFP = Port(rawValue: "BluetoothHFP")
        public static let bluetoothA2DP = Port(rawValue: "BluetoothA2DPOutput")
        public static let bluetoothLE = Port(rawValue: "BluetoothLE")
        public static let carAudio = Port(rawValue: "CarAudio")
        public static let lineOut = Port(rawValue: "LineOut")
        public static let HDMI = Port(rawValue: "HDMIOutput")
        public static let airPlay = Port(rawValue: "AirPlay")
        public static let usbAudio = Port(rawValue: "USBAudio")
    }

    // Notifications (AVAudioSession.h): `AVAudioSessionRouteChangeNotification` and friends.
    public static let routeChangeNotification = Notification.Name("AVAudioSessionRouteChangeNotification")
    public static let interruptionNotification = Notification.Name("AVAudioSessionInterruptionNotification")
    public static let mediaServicesWereResetNotification = Notification.Name("AVAudioSessionMediaServicesWereResetNotification")
}

/// `AVAudioSessionRouteChangeReasonKey` (an NSNumber of `RouteChangeReason`).
public let AVAudioSessionRouteChangeReasonKey = "AVAudioSessionRouteChangeReasonKey"
/// `AVAudioSessionRouteChangePreviousRouteKey` (the `AVAudioSessionRouteDescription` before).
public let AVAudioSessionRouteChangePreviousRouteKey = "AVAudioSessionRouteChangePreviousRouteKey"
/// `AVAudioSessionInterruptionTypeKey` (an NSNumber of `InterruptionType`).
public let AVAudioSessionInterruptionTypeKey = "AVAudioSessionInterruptionTypeKey"
/// `AVAudioSessionInterruptionOptionKey` (an NSNumber of `InterruptionOptions`).
public let AVAudioSessionInterruptionOptionKey = "AVAudioSessionInterruptionOptionKey"
/// `AVAudioSessionInterruptionReasonKey` (iOS 14.5; an NSNumber of `InterruptionReason`).
public let AVAudioSessionInterruptionReasonKey = "AVAudioSessionInterruptionReasonKey"

// MARK: AVAudioSessionRoute.h

/// `@interface AVAudioSessionPortDescription : NSObject`
open class AVAudioSessionPortDescription: NSObject, @unchecked Sendable {
    open private(set) var portType: AVAudioSession.Port
    open private(set) var portName: String
    /// `@property (readonly) NSString *UID;`
    open private(set) var uid: String

    /// Stand-in only: Apple's port descriptions come from the system.
    public init(standInPortType portType: AVAudioSession.Port, name: String, uid: String? = nil) {
        self.portType = portType
        self.portName = name
        self.uid = uid ?? "\(portType.rawValue)-\(name)"
    }
}

/// `@interface AVAudioSessionRouteDescription : NSObject`
open class AVAudioSessionRouteDescription: NSObject, @unchecked Sendable {
    open private(set) var inputs: [AVAudioSessionPortDescription]
    open private(set) var outputs: [AVAudioSessionPortDescription]

    /// Stand-in only.
    public init(standInInputs inputs: [AVAudioSessionPortDescription], outputs: [AVAudioSessionPortDescription]) {
        self.inputs = inputs
        self.outputs = outputs
    }
}

// MARK: AVAudioSession.h

/// `@interface AVAudioSession : NSObject`
open class AVAudioSession: NSObject, @unchecked Sendable {
    private static let shared = AVAudioSession()
    private let lock = NSLock()
    private var _category = Category.soloAmbient
    private var _mode = Mode.default
    private var _options: CategoryOptions = []
    private var _route = AVAudioSessionRouteDescription(
        standInInputs: [AVAudioSessionPortDescription(standInPortType: .builtInMic, name: "iPhone Microphone")],
        outputs: [AVAudioSessionPortDescription(standInPortType: .builtInReceiver, name: "Receiver")])
    private var _availableInputs = [AVAudioSessionPortDescription(standInPortType: .builtInMic, name: "iPhone Microphone")]
    private var _active = false
    private var _override = PortOverride.none
    private var _records: [StandInRecord] = []

    /// `+ (AVAudioSession *)sharedInstance;`
    open class func sharedInstance() -> AVAudioSession { shared }

    /// `@property (readonly) AVAudioSessionCategory category;`
    open var category: Category { lock.withLock { _category } }
    /// `@property (readonly) AVAudioSessionMode mode;`
    open var mode: Mode { lock.withLock { _mode } }
    /// `@property (readonly) AVAudioSessionCategoryOptions categoryOptions;`
    open var categoryOptions: CategoryOptions { lock.withLock { _options } }
    /// `@property (readonly) AVAudioSessionRouteDescription *currentRoute;`
    open var currentRoute: AVAudioSessionRouteDescription { lock.withLock { _route } }
    /// `@property (readonly, nullable) NSArray<AVAudioSessionPortDescription *> *availableInputs;`
    open var availableInputs: [AVAudioSessionPortDescription]? { lock.withLock { _availableInputs } }

    /// `- (BOOL)setCategory:(AVAudioSessionCategory)category mode:(AVAudioSessionMode)mode
    ///    options:(AVAudioSessionCategoryOptions)options error:(NSError **)outError;` (iOS 10)
    /// A change while the session is active changes the route (`categoryChange`), which ends a
    /// speaker override, as the header says an override lasts "until the current route changes".
    open func setCategory(_ category: Category, mode: Mode, options: CategoryOptions = []) throws {
        let rerouted = lock.withLock { () -> Bool in
            let changed = (category, mode, options) != (_category, _mode, _options)
            _category = category
            _mode = mode
            _options = options
            _records.append(.category(category, mode, options))
            guard changed, _active else { return false }
            _override = .none
            return true
        }
        if rerouted { postRouteChange(reason: .categoryChange, previous: currentRoute) }
    }

    /// `- (BOOL)setActive:(BOOL)active error:(NSError **)outError;`
    open func setActive(_ active: Bool) throws {
        try setActive(active, options: [])
    }

    /// `- (BOOL)setActive:(BOOL)active withOptions:(AVAudioSessionSetActiveOptions)options error:(NSError **)outError;`
    open func setActive(_ active: Bool, options: SetActiveOptions) throws {
        lock.withLock {
            _active = active
            _records.append(.active(active))
            if !active && options.contains(.notifyOthersOnDeactivation) { _records.append(.notifiedOthers) }
        }
    }

    /// `- (BOOL)overrideOutputAudioPort:(AVAudioSessionPortOverride)portOverride error:(NSError **)outError;`
    /// The real session refuses an override outside `playAndRecord`; so does this one.
    open func overrideOutputAudioPort(_ portOverride: PortOverride) throws {
        try lock.withLock {
            guard _category == .playAndRecord else { throw NSError(domain: NSOSStatusErrorDomain, code: -50) }
            _override = portOverride
            _records.append(.override(portOverride))
        }
    }

    /// `- (BOOL)setPreferredInput:(nullable AVAudioSessionPortDescription *)inPort error:(NSError **)outError;`
    /// The port must be one of `availableInputs`, as on iOS.
    open func setPreferredInput(_ inPort: AVAudioSessionPortDescription?) throws {
        try lock.withLock {
            if let inPort, !_availableInputs.contains(where: { $0.uid == inPort.uid }) {
                throw NSError(domain: NSOSStatusErrorDomain, code: -50)
            }
            _records.append(.preferredInput(inPort?.uid))
        }
    }

    // MARK: Stand-in only

    /// What the app asked of the session, in order.
    public enum StandInRecord: Equatable, Sendable {
        case category(Category, Mode, CategoryOptions)
        case active(Bool)
        /// A deactivation with `notifyOthersOnDeactivation`: other apps' audio may resume.
        case notifiedOthers
        case override(PortOverride)
        case preferredInput(String?)
    }

    public var standInRecords: [StandInRecord] { lock.withLock { _records } }
    /// Whether the session is active (the app's `setActive`, or CallKit's activation).
    public var standInIsActive: Bool { lock.withLock { _active } }
    /// The output override in force: a route change ends it.
    public var standInOutputOverride: PortOverride { lock.withLock { _override } }

    /// CallKit activates or deactivates the session for a call (before `didActivate`, after `didDeactivate`).
    public func standInSystemSetActive(_ active: Bool) {
        lock.withLock { _active = active }
    }

    public func standInReset() {
        lock.withLock {
            _records = []
            _category = .soloAmbient
            _mode = .default
            _options = []
            _active = false
            _override = .none
        }
    }

    /// The system changes the route (a headset plugged in, Bluetooth connected) and says why.
    public func standInChangeRoute(to route: AVAudioSessionRouteDescription, inputs: [AVAudioSessionPortDescription]? = nil,
                                   reason: RouteChangeReason) {
        let previous = lock.withLock {
            let previous = _route
            _route = route
            _override = .none
            if let inputs { _availableInputs = inputs }
            return previous
        }
        postRouteChange(reason: reason, previous: previous)
    }

    private func postRouteChange(reason: RouteChangeReason, previous: AVAudioSessionRouteDescription) {
        NotificationCenter.default.post(name: Self.routeChangeNotification, object: self, userInfo: [
            AVAudioSessionRouteChangeReasonKey: NSNumber(value: reason.rawValue),
            AVAudioSessionRouteChangePreviousRouteKey: previous,
        ])
    }

    /// The system interrupts the session (a cellular call, Siri) or ends the interruption.
    public func standInInterrupt(_ type: InterruptionType, options: InterruptionOptions = [], reason: InterruptionReason? = nil) {
        var info: [AnyHashable: Any] = [AVAudioSessionInterruptionTypeKey: NSNumber(value: type.rawValue)]
        if type == .ended { info[AVAudioSessionInterruptionOptionKey] = NSNumber(value: options.rawValue) }
        if let reason { info[AVAudioSessionInterruptionReasonKey] = NSNumber(value: reason.rawValue) }
        NotificationCenter.default.post(name: Self.interruptionNotification, object: self, userInfo: info)
    }

    /// The media server restarted.
    public func standInResetMediaServices() {
        NotificationCenter.default.post(name: Self.mediaServicesWereResetNotification, object: self)
    }
}

/// `NSOSStatusErrorDomain` (Foundation on Apple platforms).
public let NSOSStatusErrorDomain = "NSOSStatusErrorDomain"
