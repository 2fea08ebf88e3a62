// Stand-in for the part of Apple's AVFoundation ParleyApple uses to pick a camera, transcribed from the
// iOS SDK headers (checked against the iOS 16.5 SDK as mirrored in theos/sdks@4af4cb1d, the newest
// copy reachable here; every declaration used is in it, below the package's iOS 17 floor), AVFoundation.framework/Headers/AVCaptureDevice.h. Apple platforms use the
// real framework (which also re-exports AVFAudio and CoreMedia, as this module does).
// Camera authorization (iOS 7) is transcribed from the iOS 26.2 SDK (seayou2468-web/maciOS,
// iPhoneOS26.2.sdk/System/Library/Frameworks/AVFoundation.framework/Headers/): AVCaptureDevice.h,
// AVMediaFormat.h, and AVFoundation.apinotes for its Swift name.
// Hooks for tests are marked "Stand-in only".

@_exported import AVFAudio
@_exported import CoreMedia
import Foundation
import Synchronization

/// `typedef NSString * AVMediaType NS_EXTENSIBLE_STRING_ENUM;` (AVMediaFormat.h)
public struct AVMediaType: RawRepresentable, Hashable, Sendable {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    /// `AVF_EXPORT AVMediaType const AVMediaTypeVideo;` (`vide` at run time)
    public static let video = AVMediaType(rawValue: "vide")
}

/// `typedef NS_ENUM(NSInteger, AVAuthorizationStatus)`
public enum AVAuthorizationStatus: Int, Sendable {
    case notDetermined = 0
    case restricted = 1
    case denied = 2
    case authorized = 3
}

/// `@interface AVFrameRateRange : NSObject`
open class AVFrameRateRange: NSObject {
    /// `@property(readonly) Float64 minFrameRate;`
    open private(set) var minFrameRate: Double
    /// `@property(readonly) Float64 maxFrameRate;`
    open private(set) var maxFrameRate: Double

    /// Stand-in only.
    public init(standInMin minFrameRate: Double, max maxFrameRate: Double) {
        self.minFrameRate = minFrameRate
        self.maxFrameRate = maxFrameRate
    }
}

/// `@interface AVCaptureDevice : NSObject`
open class AVCaptureDevice: NSObject {
    /// `typedef NS_ENUM(NSInteger, AVCaptureDevicePosition)` — imported as `AVCaptureDevice.Position`.
    public enum Position: Int, Sendable {
        case unspecified = 0
        case back = 1
        case front = 2
    }

    /// `@interface AVCaptureDeviceFormat : NSObject` — imported as `AVCaptureDevice.Format`.
    open class Format: NSObject {
        /// `@property(nonatomic, readonly) CMFormatDescriptionRef formatDescription;`
        open private(set) var formatDescription: CMFormatDescription
        /// `@property(nonatomic, readonly) NSArray<AVFrameRateRange *> *videoSupportedFrameRateRanges;`
        open private(set) var videoSupportedFrameRateRanges: [AVFrameRateRange]

        /// Stand-in only.
        public init(standInWidth width: Int32, height: Int32, maxFrameRate: Double) {
            formatDescription = CMFormatDescription(standInWidth: width, height: height)
            videoSupportedFrameRateRanges = [AVFrameRateRange(standInMin: 1, max: maxFrameRate)]
        }
    }

    /// `@property(nonatomic, readonly) NSString *uniqueID;`
    open private(set) var uniqueID: String
    /// `@property(nonatomic, readonly) NSString *localizedName;`
    open private(set) var localizedName: String
    /// `@property(nonatomic, readonly) AVCaptureDevicePosition position;`
    open private(set) var position: Position
    /// `@property(nonatomic, readonly) NSArray<AVCaptureDeviceFormat *> *formats;`
    open private(set) var formats: [Format]

    /// Stand-in only: devices come from the system.
    public init(standInID uniqueID: String, name: String, position: Position, formats: [Format]) {
        self.uniqueID = uniqueID
        self.localizedName = name
        self.position = position
        self.formats = formats
    }

    /// `+ (AVAuthorizationStatus)authorizationStatusForMediaType:(AVMediaType)mediaType;` (category
    /// `AVCaptureDeviceAuthorization`; Swift name `authorizationStatus(for:)` in AVFoundation.apinotes)
    /// — `.notDetermined` until the user answers the app's first request.
    open class func authorizationStatus(for mediaType: AVMediaType) -> AVAuthorizationStatus {
        authorizations.withLock { $0[mediaType] } ?? .notDetermined
    }

    // MARK: Stand-in only

    /// The user's answer for the app, or a restriction (Screen Time, a device profile).
    public static func standInSetAuthorization(_ status: AVAuthorizationStatus, for mediaType: AVMediaType) {
        authorizations.withLock { $0[mediaType] = status }
    }

    private static let authorizations = Mutex<[AVMediaType: AVAuthorizationStatus]>([:])
}
