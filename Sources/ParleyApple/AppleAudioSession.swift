// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import AVFAudio
import Foundation
import Logging
import ParleyKit
import WebRTC

/// The SDK's `AudioSession` over AVAudioSession, through WebRTC's `RTCAudioSession` with
/// `useManualAudio`: WebRTC's audio unit runs only while `isAudioEnabled`, which the core sets from
/// CallKit's `didActivate` and `didDeactivate` — never by activating the session itself.
///
/// It also reports what the system does to the session (route changes, interruptions, a media
/// services reset) as the core's `AudioRouteEvent` and `AudioInterruption`; `ParleyPhone` hands
/// them to `CallManager`, whose `AudioRoutePolicy` decides.
public final class AppleAudioSession: AudioSession, @unchecked Sendable {
    public enum Event: Hashable, Sendable {
        case route(AudioRouteEvent)
        case interruption(AudioInterruption)
    }

    public let events: AsyncStream<Event>
    private let sink: AsyncStream<Event>.Continuation
    private let rtc: RTCAudioSession
    private let notifications: NotificationCenter
    private let logger: Logger
    private var observers: [any NSObjectProtocol] = []

    public init(rtc: RTCAudioSession = .sharedInstance(), notifications: NotificationCenter = .default,
                logger: Logger = Logger(label: "parley.audio")) {
        self.rtc = rtc
        self.notifications = notifications
        self.logger = logger
        (events, sink) = AsyncStream.makeStream()
        rtc.useManualAudio = true
        rtc.isAudioEnabled = false
        observe()
    }

    deinit {
        for observer in observers { notifications.removeObserver(observer) }
        sink.finish()
    }

    // MARK: AudioSession

    public func configure(_ configuration: CallAudioConfiguration) async {
        let category = AVAudioSession.Category.playAndRecord
        let mode: AVAudioSession.Mode = configuration.video ? .videoChat : .voiceChat
        let options: AVAudioSession.CategoryOptions = [Self.bluetoothHFP, .allowBluetoothA2DP]
        // WebRTC applies its own configuration when its audio unit starts (voiceChat, HFP only,
        // unless told otherwise): it is told the call's, so the start changes nothing.
        let webRTC = RTCAudioSessionConfiguration.webRTC()
        webRTC.category = category.rawValue
        webRTC.mode = mode.rawValue
        webRTC.categoryOptions = options
        RTCAudioSessionConfiguration.setWebRTC(webRTC)
        withConfiguration { rtc in try rtc.setCategory(category, mode: mode, options: options) }
    }

    /// Bluetooth hands-free (HFP): `allowBluetoothHFP` in the iOS 26 SDK (Xcode 26, Swift 6.2), which
    /// deprecates the older name; `allowBluetooth`, the same option, in the iOS 18 SDK (Xcode 16).
    static var bluetoothHFP: AVAudioSession.CategoryOptions {
        #if compiler(>=6.2)
        .allowBluetoothHFP
        #else
        .allowBluetooth
        #endif
    }

    public func setAudioEnabled(_ enabled: Bool) async {
        if enabled {
            rtc.audioSessionDidActivate(rtc.session)
            rtc.isAudioEnabled = true
        } else {
            rtc.isAudioEnabled = false
            rtc.audioSessionDidDeactivate(rtc.session)
        }
    }

    public func overrideOutputToSpeaker(_ speaker: Bool) async {
        withConfiguration { rtc in try rtc.overrideOutputAudioPort(speaker ? .speaker : .none) }
    }

    public func route(to output: AudioOutput) async {
        withConfiguration { rtc in
            switch output {
            case .speaker:
                try rtc.overrideOutputAudioPort(.speaker)
            case .receiver:
                try rtc.overrideOutputAudioPort(.none)
                if let mic = Self.input(.builtInMic, in: rtc.session) { try rtc.setPreferredInput(mic) }
            case .wiredHeadset, .bluetooth, .carAudio:
                // An output follows its input: choosing the headset's (or the car's) microphone routes to it.
                try rtc.overrideOutputAudioPort(.none)
                if let input = Self.input(for: output, in: rtc.session) { try rtc.setPreferredInput(input) }
            }
        }
    }

    /// A voice room is not a CallKit call, so no `didActivate` comes: the session is configured and
    /// audio enabled, and WebRTC activates the session when its audio unit starts (the room's media
    /// is negotiated). Never during a CallKit call.
    public func activateForRoom() async {
        await configure(CallAudioConfiguration(video: false))
        rtc.isAudioEnabled = true
    }

    /// Leaving a room: audio off, and WebRTC's audio unit, stopping, makes the last deactivation,
    /// which gives the session back to the system and lets other apps' audio resume
    /// (RTCAudioSession.mm deactivates only while it counts itself active, on the last unbalanced
    /// activation: telling it of a deactivation first, or activating the session beside it, would
    /// leave AVAudioSession active for good).
    public func deactivateAfterRoom() async {
        rtc.isAudioEnabled = false
    }

    private func withConfiguration(_ body: (RTCAudioSession) throws -> Void) {
        rtc.lockForConfiguration()
        defer { rtc.unlockForConfiguration() }
        // The call goes on with the session as it is (iOS refuses, say, a route that just went away).
        do { try body(rtc) } catch { logger.notice("the audio session refused a change", metadata: ["error": "\(error)"]) }
    }

    // MARK: What the system does

    private func observe() {
        let sink = self.sink
        observers.append(notifications.addObserver(forName: AVAudioSession.routeChangeNotification, object: nil, queue: nil) { note in
            let previous = note.userInfo?[AVAudioSessionRouteChangePreviousRouteKey] as? AVAudioSessionRouteDescription
            guard let raw = (note.userInfo?[AVAudioSessionRouteChangeReasonKey] as? NSNumber)?.uintValue,
                  let reason = AVAudioSession.RouteChangeReason(rawValue: raw),
                  let event = Self.routeEvent(reason: reason, current: AVAudioSession.sharedInstance().currentRoute,
                                              previous: previous) else { return }
            sink.yield(.route(event))
        })
        observers.append(notifications.addObserver(forName: AVAudioSession.interruptionNotification, object: nil, queue: nil) { note in
            guard let interruption = Self.interruption(note.userInfo ?? [:]) else { return }
            sink.yield(.interruption(interruption))
        })
        observers.append(notifications.addObserver(forName: AVAudioSession.mediaServicesWereResetNotification, object: nil, queue: nil) { _ in
            sink.yield(.interruption(.mediaServicesReset))
        })
    }

    /// What a route change means for the call: a device that came or went, or a category change.
    static func routeEvent(reason: AVAudioSession.RouteChangeReason, current: AVAudioSessionRouteDescription,
                           previous: AVAudioSessionRouteDescription?) -> AudioRouteEvent? {
        let now = current.outputs.compactMap(Self.output(for:))
        let before = previous?.outputs.compactMap(Self.output(for:)) ?? []
        switch reason {
        case .newDeviceAvailable:
            return now.first { !before.contains($0) }.map(AudioRouteEvent.newDeviceAvailable)
        case .oldDeviceUnavailable:
            return before.first { !now.contains($0) }.map(AudioRouteEvent.oldDeviceUnavailable)
        case .categoryChange:
            return .categoryChange
        default:
            return nil
        }
    }

    /// An interruption notification's meaning. During a CallKit call another call does not arrive
    /// this way (CallKit holds the call and deactivates the session); what does is Siri, an alarm,
    /// another app's audio: the system's.
    static func interruption(_ userInfo: [AnyHashable: Any]) -> AudioInterruption? {
        guard let raw = (userInfo[AVAudioSessionInterruptionTypeKey] as? NSNumber)?.uintValue,
              let type = AVAudioSession.InterruptionType(rawValue: raw) else { return nil }
        // Not a switch: the imported Objective-C enum is open on Apple platforms and closed here.
        if type == .began { return .beganBySystem }
        guard type == .ended else { return nil }
        let options = AVAudioSession.InterruptionOptions(rawValue: (userInfo[AVAudioSessionInterruptionOptionKey] as? NSNumber)?.uintValue ?? 0)
        return .ended(shouldResume: options.contains(.shouldResume))
    }

    /// The core's name for an output port; nil for ports a call does not route to (AirPlay, HDMI…).
    static func output(for port: AVAudioSessionPortDescription) -> AudioOutput? {
        switch port.portType {
        case .builtInReceiver: .receiver
        case .builtInSpeaker: .speaker
        case .headphones: .wiredHeadset
        case .bluetoothHFP, .bluetoothA2DP, .bluetoothLE: .bluetooth(port.portName)
        case .carAudio: .carAudio
        default: nil
        }
    }

    /// The input that routes to `output`.
    static func input(for output: AudioOutput, in session: AVAudioSession) -> AVAudioSessionPortDescription? {
        let inputs = session.availableInputs ?? []
        switch output {
        case .receiver, .speaker: return inputs.first { $0.portType == .builtInMic }
        case .wiredHeadset: return inputs.first { $0.portType == .headsetMic }
        case .bluetooth(let name): return inputs.first { $0.portType == .bluetoothHFP && $0.portName == name }
        case .carAudio: return inputs.first { $0.portType == .carAudio }
        }
    }

    static func input(_ type: AVAudioSession.Port, in session: AVAudioSession) -> AVAudioSessionPortDescription? {
        session.availableInputs?.first { $0.portType == type }
    }
}
#endif
