// Stand-in for WebRTC's RTCAudioSession and RTCAudioSessionConfiguration on Linux, transcribed from
// sdk/objc/components/audio/RTCAudioSession.h and RTCAudioSessionConfiguration.h, and behaving as
// RTCAudioSession.mm, RTCAudioSession+Configuration.mm and the audio device
// (sdk/objc/native/src/audio/audio_device_ios.mm) do at M120 (Google's sources @507f1cc3270d):
//
// - `setActive:` activates AVAudioSession only when it is not active, and deactivates it only on the
//   last unbalanced call (`isActive && activationCount == 1`), with NotifyOthersOnDeactivation; a
//   deactivation clears `isActive` and counts down whether or not it reached the system.
// - `audioSessionDidActivate:` / `audioSessionDidDeactivate:` (CallKit's activation, told by the app)
//   count up and down and set `isActive`, without touching AVAudioSession.
// - WebRTC's audio device configures the session when its audio unit starts — when audio is
//   initialized (a call's audio is negotiated: `standInAudioDeviceStarts()` here) and it may play or
//   record (`!useManualAudio || isAudioEnabled`): it applies `RTCAudioSessionConfiguration.webRTC()`
//   and activates (`configureWebRTCSession:`); when the unit stops it deactivates
//   (`unconfigureWebRTCSession:`).

import AVFAudio
import Foundation
import StandInSupport

// MARK: RTCAudioSessionConfiguration.h

/// `@interface RTCAudioSessionConfiguration : NSObject`
open class RTCAudioSessionConfiguration: NSObject {
    private static let global = StandInLockedBox(RTCAudioSessionConfiguration())

    /// `@property(nonatomic, strong) NSString *category;`
    open var category: String = AVAudioSession.Category.playAndRecord.rawValue
    /// `@property(nonatomic, assign) AVAudioSessionCategoryOptions categoryOptions;`
    open var categoryOptions: AVAudioSession.CategoryOptions = [.allowBluetoothHFP]
    /// `@property(nonatomic, strong) NSString *mode;`
    open var mode: String = AVAudioSession.Mode.voiceChat.rawValue

    /// `- (instancetype)init NS_DESIGNATED_INITIALIZER;` (WebRTC's defaults: playAndRecord, voiceChat, HFP)
    override public init() {}

    /// `+ (instancetype)webRTCConfiguration;`
    open class func webRTC() -> Self {
        // The stand-in's classes are not subclassed; `Self` keeps the imported spelling.
        global.withLock { $0 } as! Self
    }

    /// `+ (void)setWebRTCConfiguration:(RTCAudioSessionConfiguration *)configuration;`
    open class func setWebRTC(_ configuration: RTCAudioSessionConfiguration) {
        global.withLock { $0 = configuration }
    }
}

// MARK: RTCAudioSession.h

/// `@interface RTCAudioSession : NSObject <RTCAudioSessionActivationDelegate>`: WebRTC's proxy for
/// AVAudioSession. With `useManualAudio`, audio I/O runs only while `isAudioEnabled`.
open class RTCAudioSession: NSObject {
    // One per process, as upstream's `sharedInstance`; its state is behind `lock`.
    nonisolated(unsafe) private static let shared = RTCAudioSession()
    private let lock = NSRecursiveLock()
    private var _useManualAudio = false
    private var _isAudioEnabled = false
    private var _isActive = false
    private var activationCount = 0
    private var locked = false
    /// The audio device: initialized (a call's audio negotiated), and its unit running.
    private var audioInitialized = false
    private var unitRunning = false
    private var _records: [StandInRecord] = []

    /// `+ (instancetype)sharedInstance;`
    open class func sharedInstance() -> RTCAudioSession { shared }

    /// `@property(nonatomic, readonly) AVAudioSession *session;`
    open var session: AVAudioSession { AVAudioSession.sharedInstance() }

    /// `@property(nonatomic, readonly) BOOL isActive;`
    open var isActive: Bool { lock.withLock { _isActive } }

    /// `@property(nonatomic, assign) BOOL useManualAudio;`
    open var useManualAudio: Bool {
        get { lock.withLock { _useManualAudio } }
        set {
            lock.withLock { _useManualAudio = newValue; _records.append(.useManualAudio(newValue)) }
            updateAudioUnit()
        }
    }

    /// `@property(nonatomic, assign) BOOL isAudioEnabled;`
    open var isAudioEnabled: Bool {
        get { lock.withLock { _isAudioEnabled } }
        set {
            lock.withLock { _isAudioEnabled = newValue; _records.append(.audioEnabled(newValue)) }
            updateAudioUnit()
        }
    }

    /// `@property(readonly) NSString *category;`
    open var category: String { session.category.rawValue }
    /// `@property(readonly) AVAudioSessionCategoryOptions categoryOptions;`
    open var categoryOptions: AVAudioSession.CategoryOptions { session.categoryOptions }
    /// `@property(readonly) NSString *mode;`
    open var mode: String { session.mode.rawValue }

    /// `- (void)lockForConfiguration;`
    open func lockForConfiguration() { lock.withLock { locked = true } }
    /// `- (void)unlockForConfiguration;`
    open func unlockForConfiguration() { lock.withLock { locked = false } }

    /// `- (BOOL)setCategory:(AVAudioSessionCategory)category mode:(AVAudioSessionMode)mode
    ///    options:(AVAudioSessionCategoryOptions)options error:(NSError **)outError;`
    /// Like every setter of RTCAudioSession, it must be called between lock and unlock.
    open func setCategory(_ category: AVAudioSession.Category, mode: AVAudioSession.Mode, options: AVAudioSession.CategoryOptions = []) throws {
        try requireLock()
        try session.setCategory(category, mode: mode, options: options)
    }

    /// `- (BOOL)overrideOutputAudioPort:(AVAudioSessionPortOverride)portOverride error:(NSError **)outError;`
    open func overrideOutputAudioPort(_ portOverride: AVAudioSession.PortOverride) throws {
        try requireLock()
        try session.overrideOutputAudioPort(portOverride)
    }

    /// `- (BOOL)setPreferredInput:(AVAudioSessionPortDescription *)inPort error:(NSError **)outError;`
    open func setPreferredInput(_ inPort: AVAudioSessionPortDescription) throws {
        try requireLock()
        try session.setPreferredInput(inPort)
    }

    /// `- (BOOL)setActive:(BOOL)active error:(NSError **)outError;` — as RTCAudioSession.mm.
    open func setActive(_ active: Bool) throws {
        try requireLock()
        try lock.withLock {
            let shouldSetActive = (active && !_isActive) || (!active && _isActive && activationCount == 1)
            var failure: (any Error)?
            if shouldSetActive {
                do {
                    try session.setActive(active, options: active ? [] : .notifyOthersOnDeactivation)
                } catch {
                    failure = error
                }
            }
            if active {
                if failure == nil {
                    if shouldSetActive { _isActive = true }
                    activationCount += 1
                }
            } else {
                // Cleared and counted down whether or not the system was asked.
                _isActive = false
                activationCount -= 1
            }
            if let failure { throw failure }
        }
    }

    /// `- (void)audioSessionDidActivate:(AVAudioSession *)session;` (RTCAudioSessionActivationDelegate)
    open func audioSessionDidActivate(_ session: AVAudioSession) {
        lock.withLock {
            _records.append(.didActivate)
            activationCount += 1
            _isActive = true
        }
    }

    /// `- (void)audioSessionDidDeactivate:(AVAudioSession *)session;`
    open func audioSessionDidDeactivate(_ session: AVAudioSession) {
        lock.withLock {
            _records.append(.didDeactivate)
            _isActive = false
            activationCount -= 1
        }
    }

    private func requireLock() throws {
        // RTCAudioSession logs and returns NO when not locked (RTCAudioSession.mm, checkLock:).
        guard lock.withLock({ locked }) else { throw NSError(domain: "RTCAudioSession", code: -1) }
    }

    /// The audio device's `UpdateAudioUnit`: the unit runs while audio is initialized and may play
    /// or record; starting it configures the session (`configureWebRTCSession:`), stopping it gives
    /// the activation back (`unconfigureWebRTCSession:`).
    private func updateAudioUnit() {
        lock.withLock {
            let shouldRun = audioInitialized && (!_useManualAudio || _isAudioEnabled)
            guard shouldRun != unitRunning else { return }
            unitRunning = shouldRun
            let wasLocked = locked
            locked = true
            defer { locked = wasLocked }
            if shouldRun {
                let configuration = RTCAudioSessionConfiguration.webRTC()
                let category = AVAudioSession.Category(rawValue: configuration.category)
                let mode = AVAudioSession.Mode(rawValue: configuration.mode)
                // RTCAudioSession+Configuration.mm: the category is set only when it differs.
                if session.category != category || session.mode != mode || session.categoryOptions != configuration.categoryOptions {
                    try? setCategory(category, mode: mode, options: configuration.categoryOptions)
                }
                try? setActive(true)
            } else {
                try? setActive(false)
            }
        }
    }

    // MARK: Stand-in only

    public enum StandInRecord: Equatable, Sendable {
        case useManualAudio(Bool)
        case audioEnabled(Bool)
        case didActivate
        case didDeactivate
    }

    public var standInRecords: [StandInRecord] { lock.withLock { _records } }
    /// The unbalanced activations RTCAudioSession counts (`activationCount`, private upstream).
    public var standInActivationCount: Int { lock.withLock { activationCount } }
    /// Whether WebRTC's audio unit runs (plays and records).
    public var standInAudioUnitRunning: Bool { lock.withLock { unitRunning } }

    /// A call's audio was negotiated: WebRTC's audio device initializes playout and recording
    /// (`InitPlayOrRecord`), and its unit starts if audio may play.
    public func standInAudioDeviceStarts() {
        lock.withLock { audioInitialized = true }
        updateAudioUnit()
    }

    /// The last peer connection with audio closed: the device shuts down (`ShutdownPlayOrRecord`).
    public func standInAudioDeviceStops() {
        lock.withLock { audioInitialized = false }
        updateAudioUnit()
    }

    public func standInReset() {
        lock.withLock {
            _records = []
            _isAudioEnabled = false
            _useManualAudio = false
            _isActive = false
            activationCount = 0
            audioInitialized = false
            unitRunning = false
            locked = false
        }
        RTCAudioSessionConfiguration.setWebRTC(RTCAudioSessionConfiguration())
    }
}
