import ParleyApple
import SwiftUI
import UIKit
import UserNotifications

/// The example app: a one-to-one voice and video phone on Parley, with a voice room. Everything
/// beyond the views lives in ParleyApple (`PhoneModel`, `ParleyPhone`, the adapters), compiled and
/// tested on Linux.
@main
struct ParleyPhoneApp: App {
    @UIApplicationDelegateAdaptor(AppDelegate.self) private var delegate

    var body: some Scene {
        WindowGroup {
            ContentView(model: delegate.model)
        }
    }
}

/// Holds what the app has once per process: the call system (CallKit's provider and PushKit's
/// registry) and the model, whose phone belongs to the signed-in user.
final class AppDelegate: NSObject, UIApplicationDelegate {
    /// Made with the delegate, as the app launches, and kept for the life of the process: iOS
    /// delivers a VoIP push that launched the app only to a registry that exists by the end of
    /// `didFinishLaunching`, and every push must be reported to CallKit, signed in or not.
    let system = CallSystem()

    private(set) lazy var model: PhoneModel = {
        let system = self.system
        return PhoneModel(store: UserDefaultsSessionStore(), topic: Bundle.main.bundleIdentifier ?? "net.parley.phone",
                          pushEnvironment: AppSettings.pushEnvironment) { configuration in
            // One phone per signed-in user, on the app's one call system.
            ParleyPhone(configuration: configuration, system: system)
        }
    }()

    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]? = nil) -> Bool {
        // The saved user's phone, before this returns: a push that launched the app is theirs.
        model.restore()
        // Missed-call alerts come to the app's notification token (a VoIP token cannot take them).
        UNUserNotificationCenter.current().requestAuthorization(options: [.alert, .sound, .badge]) { granted, _ in
            guard granted else { return }
            DispatchQueue.main.async { application.registerForRemoteNotifications() }
        }
        return true
    }

    func application(_ application: UIApplication, didRegisterForRemoteNotificationsWithDeviceToken deviceToken: Data) {
        Task { await model.phone?.registerAlertToken(deviceToken) }
    }
}

/// Settings the build puts in Info.plist (project.yml: PARLEY_SERVER_URL, PARLEY_APS_ENVIRONMENT).
enum AppSettings {
    static var server: URL {
        (Bundle.main.object(forInfoDictionaryKey: "ParleyServerURL") as? String).flatMap(URL.init(string:))
            ?? URL(string: "http://127.0.0.1:8080")!
    }

    /// The push environment of this build's VoIP token. `ParleyAPSEnvironment` is the value the
    /// build also writes into the `aps-environment` entitlement, so the two cannot disagree.
    static var pushEnvironment: VoIPRegistration.Environment {
        switch Bundle.main.object(forInfoDictionaryKey: "ParleyAPSEnvironment") as? String {
        case "production"?: .production
        default: .sandbox  // "development": builds signed for development get sandbox tokens
        }
    }
}

/// Keeps the signed-in session between launches, and the installation's device id.
struct UserDefaultsSessionStore: PhoneModel.SessionStore {
    private static let key = "parley.session"
    private static let deviceKey = "parley.device"

    func installationDevice() -> DeviceID {
        if let saved = UserDefaults.standard.string(forKey: Self.deviceKey).flatMap(DeviceID.init(rawValue:)) { return saved }
        let device = DeviceID(rawValue: "ios-\(UUID().uuidString.prefix(8).lowercased())")!
        UserDefaults.standard.set(device.rawValue, forKey: Self.deviceKey)
        return device
    }

    func load() -> PhoneModel.Session? {
        UserDefaults.standard.data(forKey: Self.key).flatMap { try? JSONDecoder().decode(PhoneModel.Session.self, from: $0) }
    }

    func save(_ session: PhoneModel.Session?) {
        if let session, let data = try? JSONEncoder().encode(session) {
            UserDefaults.standard.set(data, forKey: Self.key)
        } else {
            UserDefaults.standard.removeObject(forKey: Self.key)
        }
    }
}
