import ParleyApple
import ParleyKit
import ParleyProtocol
import SwiftUI
import UIKit
import UserNotifications

/// The example app: a one-to-one voice phone on Parley. Everything beyond the views lives in
/// ParleyApple (`PhoneModel`, `ParleyPhone`, the adapters), compiled and tested on Linux.
@main
struct ParleyPhoneApp: App {
    @UIApplicationDelegateAdaptor(AppDelegate.self) private var delegate

    var body: some Scene {
        WindowGroup {
            ContentView(model: delegate.model)
        }
    }
}

/// Creates the push registry and the phone at launch: iOS delivers a VoIP push that wakes a killed
/// app only to a registry that exists by the end of `didFinishLaunching`, and the call must be
/// reported to CallKit before the push's completion.
final class AppDelegate: NSObject, UIApplicationDelegate {
    let pushes = PushKitVoIPSource()
    private(set) lazy var model: PhoneModel = {
        let pushes = self.pushes
        return PhoneModel(store: UserDefaultsSessionStore(), topic: Bundle.main.bundleIdentifier ?? "net.parley.phone",
                          pushEnvironment: AppSettings.pushEnvironment) { configuration in
            ParleyPhone(configuration: configuration, pushSource: pushes)
        }
    }()

    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]? = nil) -> Bool {
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

/// Settings the build puts in Info.plist (project.yml: PARLEY_SERVER_URL, PARLEY_PUSH_ENVIRONMENT).
enum AppSettings {
    static var server: URL {
        (Bundle.main.object(forInfoDictionaryKey: "ParleyServerURL") as? String).flatMap(URL.init(string:))
            ?? URL(string: "http://127.0.0.1:8080")!
    }

    static var pushEnvironment: VoIPRegistration.Environment {
        (Bundle.main.object(forInfoDictionaryKey: "ParleyPushEnvironment") as? String).flatMap(VoIPRegistration.Environment.init(rawValue:))
            ?? .sandbox
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
