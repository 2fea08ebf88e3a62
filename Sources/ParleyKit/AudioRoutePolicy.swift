/// Where call audio plays.
public enum AudioOutput: Hashable, Sendable {
    case receiver
    case speaker
    case wiredHeadset
    case bluetooth(String)
    case carAudio

    /// Devices the user plugged in or paired are preferred, most specific first.
    var preference: Int {
        switch self {
        case .carAudio: 4
        case .wiredHeadset: 3
        case .bluetooth: 2
        case .speaker: 1
        case .receiver: 0
        }
    }

    var isExternal: Bool { preference >= 2 }
}

/// Why the route changed (AVAudioSession.RouteChangeReason, the ones a call cares about), or what
/// the user asked for.
public enum AudioRouteEvent: Hashable, Sendable {
    case newDeviceAvailable(AudioOutput)
    case oldDeviceUnavailable(AudioOutput)
    /// Something else changed the session's category.
    case categoryChange
    /// The user's speaker button.
    case speakerButton(on: Bool)
}

public enum AudioInterruption: Hashable, Sendable {
    /// Another call (cellular, another VoIP app) took the audio.
    case beganByCall
    /// Siri, an alarm, another app's audio: media pauses, the call stays up.
    case beganBySystem
    case ended(shouldResume: Bool)
    /// The media server restarted: every audio object is gone and must be rebuilt.
    case mediaServicesReset
}

/// Audio route and interruption policy during a call (apple-rules.md 4–6): a struct whose events
/// return the actions to perform.
///
/// - A device that appears is used; when the device in use disappears, audio falls back to the best
///   remaining one (the speaker if the user chose it, else the receiver, or the speaker for video).
/// - The speaker button is a temporary output override, not the `defaultToSpeaker` option; plugging
///   in a headset cancels it.
/// - An interruption by another call holds this call; one by the system only pauses media. When it
///   ends with "should resume", media resumes (and the call is unheld if the interruption held it);
///   without, media stays paused until the user resumes.
/// - After a media services reset the session is configured again and audio restarted.
public struct AudioRoutePolicy: Sendable {
    public enum Action: Hashable, Sendable {
        case route(to: AudioOutput)
        case overrideToSpeaker(Bool)
        case pauseMedia
        case resumeMedia
        case holdCall
        case unholdCall
        case reconfigureSession
        case restartAudio
        /// The route the UI should show.
        case show(AudioOutput)
        /// Media is paused and waits for the user.
        case showPausedAwaitingUser
    }

    public private(set) var current: AudioOutput
    public private(set) var available: Set<AudioOutput>
    public private(set) var speakerOverride = false
    public private(set) var interrupted = false
    private var heldByInterruption = false
    private let video: Bool

    public init(video: Bool, available: Set<AudioOutput> = [.receiver, .speaker]) {
        self.video = video
        var devices = available
        devices.formUnion([.receiver, .speaker])
        self.available = devices
        let external = devices.filter(\.isExternal).max { $0.preference < $1.preference }
        current = external ?? (video ? .speaker : .receiver)
    }

    public mutating func handle(_ event: AudioRouteEvent) -> [Action] {
        switch event {
        case .newDeviceAvailable(let device):
            available.insert(device)
            guard device.isExternal else { return [] }
            var actions: [Action] = []
            if speakerOverride {
                speakerOverride = false
                actions.append(.overrideToSpeaker(false))
            }
            current = device
            return actions + [.route(to: device), .show(device)]
        case .oldDeviceUnavailable(let device):
            available.remove(device)
            guard device == current else { return [] }
            current = fallback()
            return [.route(to: current), .show(current)]
        case .categoryChange:
            return interrupted ? [] : [.reconfigureSession]
        case .speakerButton(let on):
            guard on != speakerOverride else { return [] }
            speakerOverride = on
            current = on ? .speaker : fallback()
            return [.overrideToSpeaker(on), .show(current)]
        }
    }

    public mutating func handle(_ interruption: AudioInterruption) -> [Action] {
        switch interruption {
        case .beganByCall:
            guard !interrupted else { return [] }
            interrupted = true
            heldByInterruption = true
            return [.pauseMedia, .holdCall]
        case .beganBySystem:
            guard !interrupted else { return [] }
            interrupted = true
            return [.pauseMedia]
        case .ended(let shouldResume):
            guard interrupted else { return [] }
            guard shouldResume else { return [.showPausedAwaitingUser] }
            return resume()
        case .mediaServicesReset:
            var actions: [Action] = [.reconfigureSession, .restartAudio, .route(to: current)]
            if speakerOverride { actions.append(.overrideToSpeaker(true)) }
            return actions
        }
    }

    /// The user resumed after an interruption that ended without "should resume".
    public mutating func userResumed() -> [Action] {
        guard interrupted else { return [] }
        return resume()
    }

    private mutating func resume() -> [Action] {
        interrupted = false
        var actions: [Action] = [.reconfigureSession, .resumeMedia]
        if heldByInterruption {
            heldByInterruption = false
            actions.append(.unholdCall)
        }
        return actions
    }

    private func fallback() -> AudioOutput {
        if speakerOverride { return .speaker }
        if let external = available.filter(\.isExternal).max(by: { $0.preference < $1.preference }) { return external }
        return video ? .speaker : .receiver
    }
}
