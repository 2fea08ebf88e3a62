// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import Foundation

/// What an app has once per process, made at launch and kept: CallKit's provider (Apple asks for one
/// per app) and PushKit's registry. Each signed-in user's `ParleyPhone` uses them in turn; between
/// phones, VoIP pushes are still reported (and ended), as iOS requires.
///
/// ```swift
/// final class AppDelegate: NSObject, UIApplicationDelegate {
///     let system = CallSystem()   // before didFinishLaunching returns
/// }
/// ```
public final class CallSystem: Sendable {
    public let callKit: CallKitProvider
    public let pushes: PushKitVoIPSource

    /// - Parameters:
    ///   - callKit: what the system's call UI shows (ringtone, icon, video, call groups).
    ///   - pushQueue: where PushKit calls its delegate; the main queue unless a test says otherwise.
    public init(callKit configuration: CallKitProvider.Configuration = .init(), pushQueue: DispatchQueue = .main) {
        callKit = CallKitProvider(configuration: configuration)
        pushes = PushKitVoIPSource(callKit: callKit, queue: pushQueue)
    }
}
#endif
