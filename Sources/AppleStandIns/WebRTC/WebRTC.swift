// Stand-in for Google's WebRTC Objective-C framework on Linux: only the declarations ParleyApple uses,
// transcribed from WebRTC's sdk/objc/api/peerconnection/*.h and sdk/objc/components/audio/
// RTCAudioSession.h (checked against M125, webrtc-sdk/webrtc m125_release = upstream branch-heads/6422;
// the package pins stasel/WebRTC 120.0.0, M120, which has every declaration used — the typed
// setCategory:mode:options:error: since M116), in the Swift spelling the standard import rules give
// (the headers have no NS_SWIFT_NAME; RTC_OBJC_TYPE(X) is `X`; a protocol sharing a class's name
// imports as `XProtocol`).
// Apple platforms use the real framework; this module exists only in the Linux build.
//
// The peer connection here negotiates nothing: it keeps the W3C signaling state machine (the
// transitions libwebrtc allows and the errors it gives for the others), records what was asked of it,
// and lets a test play the network (delegate events, statistics). What it receives it takes from the
// remote description, as libwebrtc does under Unified Plan (pc/sdp_offer_answer.cc, M120): each
// m= section's media, mid, direction and a=msid lines decide the transceivers that start or stop
// receiving and the remote streams, and the delegate hears of them in libwebrtc's order. Hooks are
// marked "Stand-in only".

import AVFoundation
import Foundation
import StandInSupport

// MARK: RTCSessionDescription.h

/// `typedef NS_ENUM(NSInteger, RTCSdpType)`
public enum RTCSdpType: Int, Sendable {
    case offer, prAnswer, answer, rollback
}

/// `@interface RTCSessionDescription : NSObject`
open class RTCSessionDescription: NSObject {
    /// `@property(nonatomic, readonly) RTCSdpType type;`
    open private(set) var type: RTCSdpType
    /// `@property(nonatomic, readonly) NSString *sdp;`
    open private(set) var sdp: String

    /// `- (instancetype)initWithType:(RTCSdpType)type sdp:(NSString *)sdp NS_DESIGNATED_INITIALIZER;`
    public init(type: RTCSdpType, sdp: String) {
        self.type = type
        self.sdp = sdp
    }

    /// `+ (NSString *)stringForType:(RTCSdpType)type;`
    open class func string(for type: RTCSdpType) -> String {
        switch type {
        case .offer: "offer"
        case .prAnswer: "pranswer"
        case .answer: "answer"
        case .rollback: "rollback"
        }
    }

    /// `+ (RTCSdpType)typeForString:(NSString *)string;`
    open class func type(for string: String) -> RTCSdpType {
        switch string {
        case "offer": .offer
        case "pranswer": .prAnswer
        case "rollback": .rollback
        default: .answer
        }
    }
}

// MARK: RTCIceCandidate.h

/// `@interface RTCIceCandidate : NSObject`
open class RTCIceCandidate: NSObject {
    /// `@property(nonatomic, readonly, nullable) NSString *sdpMid;`
    open private(set) var sdpMid: String?
    /// `@property(nonatomic, readonly) int sdpMLineIndex;`
    open private(set) var sdpMLineIndex: Int32
    /// `@property(nonatomic, readonly) NSString *sdp;`
    open private(set) var sdp: String

    /// `- (instancetype)initWithSdp:(NSString *)sdp sdpMLineIndex:(int)sdpMLineIndex sdpMid:(nullable NSString *)sdpMid NS_DESIGNATED_INITIALIZER;`
    public init(sdp: String, sdpMLineIndex: Int32, sdpMid: String?) {
        self.sdp = sdp
        self.sdpMLineIndex = sdpMLineIndex
        self.sdpMid = sdpMid
    }
}

// MARK: RTCIceServer.h

/// `@interface RTCIceServer : NSObject`
open class RTCIceServer: NSObject {
    open private(set) var urlStrings: [String]
    open private(set) var username: String?
    open private(set) var credential: String?

    /// `- (instancetype)initWithURLStrings:(NSArray<NSString *> *)urlStrings username:(nullable NSString *)username credential:(nullable NSString *)credential;`
    public init(urlStrings: [String], username: String?, credential: String?) {
        self.urlStrings = urlStrings
        self.username = username
        self.credential = credential
    }
}

// MARK: RTCConfiguration.h

/// `typedef NS_ENUM(NSInteger, RTCIceTransportPolicy)`
public enum RTCIceTransportPolicy: Int, Sendable {
    case none, relay, noHost, all
}

/// `typedef NS_ENUM(NSInteger, RTCBundlePolicy)`
public enum RTCBundlePolicy: Int, Sendable {
    case balanced, maxCompat, maxBundle
}

/// `typedef NS_ENUM(NSInteger, RTCRtcpMuxPolicy)`
public enum RTCRtcpMuxPolicy: Int, Sendable {
    case negotiate, require
}

/// `typedef NS_ENUM(NSInteger, RTCContinualGatheringPolicy)`
public enum RTCContinualGatheringPolicy: Int, Sendable {
    case gatherOnce, gatherContinually
}

/// `typedef NS_ENUM(NSInteger, RTCSdpSemantics)`
public enum RTCSdpSemantics: Int, Sendable {
    case planB, unifiedPlan
}

/// `@interface RTCConfiguration : NSObject`
open class RTCConfiguration: NSObject {
    open var iceServers: [RTCIceServer] = []
    open var iceTransportPolicy: RTCIceTransportPolicy = .all
    open var bundlePolicy: RTCBundlePolicy = .balanced
    open var rtcpMuxPolicy: RTCRtcpMuxPolicy = .require
    open var continualGatheringPolicy: RTCContinualGatheringPolicy = .gatherOnce
    /// Unified Plan is the default since M93.
    open var sdpSemantics: RTCSdpSemantics = .unifiedPlan

    override public init() {}
}

// MARK: RTCMediaConstraints.h

/// `RTC_EXTERN NSString *const kRTCMediaConstraintsIceRestart;`
public let kRTCMediaConstraintsIceRestart = "IceRestart"
/// `RTC_EXTERN NSString *const kRTCMediaConstraintsOfferToReceiveAudio;`
public let kRTCMediaConstraintsOfferToReceiveAudio = "OfferToReceiveAudio"
/// `RTC_EXTERN NSString *const kRTCMediaConstraintsOfferToReceiveVideo;`
public let kRTCMediaConstraintsOfferToReceiveVideo = "OfferToReceiveVideo"
/// `RTC_EXTERN NSString *const kRTCMediaConstraintsValueTrue;`
public let kRTCMediaConstraintsValueTrue = "true"
/// `RTC_EXTERN NSString *const kRTCMediaConstraintsValueFalse;`
public let kRTCMediaConstraintsValueFalse = "false"

/// `@interface RTCMediaConstraints : NSObject`
open class RTCMediaConstraints: NSObject {
    let mandatory: [String: String]

    /// `- (instancetype)initWithMandatoryConstraints:(nullable NSDictionary<NSString *, NSString *> *)mandatory
    ///    optionalConstraints:(nullable NSDictionary<NSString *, NSString *> *)optional NS_DESIGNATED_INITIALIZER;`
    public init(mandatoryConstraints mandatory: [String: String]?, optionalConstraints optional: [String: String]?) {
        self.mandatory = mandatory ?? [:]
    }
}

// MARK: RTCMediaStreamTrack.h, RTCAudioTrack.h, RTCAudioSource.h, RTCMediaStream.h

/// `@interface RTCMediaStreamTrack : NSObject`
open class RTCMediaStreamTrack: NSObject {
    private let lock = NSLock()
    private var enabled = true
    /// `@property(nonatomic, readonly) NSString *kind;`
    open private(set) var kind: String
    /// `@property(nonatomic, readonly) NSString *trackId;`
    open private(set) var trackId: String
    /// `@property(nonatomic, assign) BOOL isEnabled;`
    open var isEnabled: Bool {
        get { lock.withLock { enabled } }
        set { lock.withLock { enabled = newValue } }
    }

    init(kind: String, trackId: String) {
        self.kind = kind
        self.trackId = trackId
    }
}

/// `@interface RTCAudioSource : RTCMediaSource`
open class RTCAudioSource: NSObject {}

/// `@interface RTCAudioTrack : RTCMediaStreamTrack`
open class RTCAudioTrack: RTCMediaStreamTrack {
    /// `@property(nonatomic, readonly) RTCAudioSource *source;`
    open private(set) var source: RTCAudioSource

    init(source: RTCAudioSource, trackId: String) {
        self.source = source
        super.init(kind: "audio", trackId: trackId)
    }
}

// MARK: RTCVideoRenderer.h, RTCVideoCapturer.h, RTCVideoSource.h, RTCVideoTrack.h, RTCCameraVideoCapturer.h

/// `@interface RTCVideoFrame : NSObject` (only as renderers receive it).
open class RTCVideoFrame: NSObject {}

/// `@protocol RTCVideoRenderer <NSObject>`
public protocol RTCVideoRenderer: NSObjectProtocol {
    /// `- (void)setSize:(CGSize)size;`
    func setSize(_ size: CGSize)
    /// `- (void)renderFrame:(nullable RTCVideoFrame *)frame;`
    func renderFrame(_ frame: RTCVideoFrame?)
}

/// `@protocol RTCVideoCapturerDelegate <NSObject>`
public protocol RTCVideoCapturerDelegate: NSObjectProtocol {
    /// `- (void)capturer:(RTCVideoCapturer *)capturer didCaptureVideoFrame:(RTCVideoFrame *)frame;`
    func capturer(_ capturer: RTCVideoCapturer, didCapture frame: RTCVideoFrame)
}

/// `@interface RTCVideoCapturer : NSObject`
open class RTCVideoCapturer: NSObject {
    /// `@property(nonatomic, weak) id<RTCVideoCapturerDelegate> delegate;`
    open weak var delegate: (any RTCVideoCapturerDelegate)?

    /// `- (instancetype)initWithDelegate:(id<RTCVideoCapturerDelegate>)delegate;`
    public init(delegate: any RTCVideoCapturerDelegate) { self.delegate = delegate }
}

/// `@interface RTCVideoSource : RTCMediaSource <RTCVideoCapturerDelegate>`
open class RTCVideoSource: NSObject, RTCVideoCapturerDelegate {
    open func capturer(_ capturer: RTCVideoCapturer, didCapture frame: RTCVideoFrame) {}
}

/// `@interface RTCVideoTrack : RTCMediaStreamTrack`
open class RTCVideoTrack: RTCMediaStreamTrack {
    private let renderersLock = NSLock()
    private var renderers: [any RTCVideoRenderer] = []

    init(trackId: String) { super.init(kind: "video", trackId: trackId) }

    /// `- (void)addRenderer:(id<RTCVideoRenderer>)renderer;`
    open func add(_ renderer: any RTCVideoRenderer) { renderersLock.withLock { renderers.append(renderer) } }
    /// `- (void)removeRenderer:(id<RTCVideoRenderer>)renderer;`
    open func remove(_ renderer: any RTCVideoRenderer) { renderersLock.withLock { renderers.removeAll { $0 === renderer } } }

    /// Stand-in only.
    public var standInRendererCount: Int { renderersLock.withLock { renderers.count } }
}

/// `@interface RTCCameraVideoCapturer : RTCVideoCapturer`
///
/// As RTCCameraVideoCapturer.m does it: starting and stopping run on the capture session's queue,
/// and the completion handlers are called there. A start fails — its handler gets the error — only
/// when the device cannot be locked for configuration. Without camera access the session runs with
/// no input: nothing is captured, and the handler gets nil (the capturer only logs it).
open class RTCCameraVideoCapturer: RTCVideoCapturer {
    private let lock = NSLock()
    private let session = DispatchQueue(label: "RTCCameraVideoCapturer.captureSession")
    private var running = false
    private var capturing: (device: AVCaptureDevice, format: AVCaptureDevice.Format, fps: Int)?

    /// `+ (NSArray<AVCaptureDevice *> *)captureDevices;`
    open class func captureDevices() -> [AVCaptureDevice] { standInDevices.withLock { $0 } }

    /// `+ (NSArray<AVCaptureDeviceFormat *> *)supportedFormatsForDevice:(AVCaptureDevice *)device;`
    open class func supportedFormats(for device: AVCaptureDevice) -> [AVCaptureDevice.Format] { device.formats }

    /// `- (void)startCaptureWithDevice:(AVCaptureDevice *)device format:(AVCaptureDeviceFormat *)format
    ///    fps:(NSInteger)fps completionHandler:(nullable void (^)(NSError *_Nullable))completionHandler;`
    open func startCapture(with device: AVCaptureDevice, format: AVCaptureDevice.Format, fps: Int,
                           completionHandler: (@Sendable ((any Error)?) -> Void)? = nil) {
        // The capturer works on its session queue, as RTCCameraVideoCapturer.m does, without Swift's checking.
        let boxed = StandInUnchecked((self, device, format))
        session.async {
            let (capturer, device, format) = boxed.value
            if let error = Self.standInLockError.withLock({ $0 }) {
                completionHandler?(error)  // -[AVCaptureDevice lockForConfiguration:] failed
                return
            }
            // An AVCaptureDeviceInput needs camera access; without one the session captures nothing.
            let input = AVCaptureDevice.authorizationStatus(for: .video) == .authorized
            capturer.lock.withLock {
                capturer.running = true
                capturer.capturing = input ? (device, format, fps) : nil
            }
            completionHandler?(nil)
        }
    }

    /// `- (void)stopCaptureWithCompletionHandler:(nullable void (^)(void))completionHandler;`
    open func stopCapture(completionHandler: (@Sendable () -> Void)? = nil) {
        let boxed = StandInUnchecked(self)
        session.async {
            let capturer = boxed.value
            capturer.lock.withLock {
                capturer.running = false
                capturer.capturing = nil
            }
            completionHandler?()
        }
    }

    // MARK: Stand-in only

    /// The cameras this "device" has.
    public static let standInDevices = StandInLockedBox<[AVCaptureDevice]>([])

    /// What `-[AVCaptureDevice lockForConfiguration:]` fails with from now on (another client holds
    /// the camera); nil: it succeeds.
    public static let standInLockError = StandInLockedBox<NSError?>(nil)

    /// Whether the capture session runs: started and not stopped, capturing or not.
    public var standInRunning: Bool { lock.withLock { running } }

    /// What it captures now: the device's id, the format's size, the frame rate.
    public var standInCapturing: (device: String, width: Int32, height: Int32, fps: Int)? {
        lock.withLock {
            capturing.map { ($0.device.uniqueID, CMVideoFormatDescriptionGetDimensions($0.format.formatDescription).width,
                             CMVideoFormatDescriptionGetDimensions($0.format.formatDescription).height, $0.fps) }
        }
    }
}

/// `@interface RTCMediaStream : NSObject` — a remote one, as libwebrtc makes it for a stream id a
/// remote description names.
open class RTCMediaStream: NSObject {
    private let lock = NSLock()
    private var audio: [RTCAudioTrack] = []
    private var video: [RTCVideoTrack] = []

    /// `@property(nonatomic, readonly) NSArray<RTCAudioTrack *> *audioTracks;`
    open var audioTracks: [RTCAudioTrack] { lock.withLock { audio } }
    /// `@property(nonatomic, readonly) NSArray<RTCVideoTrack *> *videoTracks;`
    open var videoTracks: [RTCVideoTrack] { lock.withLock { video } }

    override init() {}

    /// A receiver's track joins the stream.
    func include(_ track: RTCMediaStreamTrack) {
        lock.withLock {
            if let track = track as? RTCAudioTrack, !audio.contains(track) { audio.append(track) }
            if let track = track as? RTCVideoTrack, !video.contains(track) { video.append(track) }
        }
    }
}

// MARK: RTCRtpEncodingParameters.h, RTCRtpParameters.h, RTCDtmfSender.h, RTCRtpSender.h, RTCRtpReceiver.h, RTCRtpTransceiver.h

/// `@interface RTCRtpEncodingParameters : NSObject`
open class RTCRtpEncodingParameters: NSObject {
    /// `@property(nonatomic, assign) BOOL isActive;`
    open var isActive = true
    /// `@property(nonatomic, copy, nullable) NSNumber *maxBitrateBps;`
    open var maxBitrateBps: NSNumber?

    override public init() {}
}

/// `@interface RTCRtpParameters : NSObject`
open class RTCRtpParameters: NSObject {
    /// `@property(nonatomic, copy) NSArray<RTCRtpEncodingParameters *> *encodings;`
    open var encodings: [RTCRtpEncodingParameters] = [RTCRtpEncodingParameters()]

    override public init() {}
}

/// `@protocol RTCDtmfSender <NSObject>`
public protocol RTCDtmfSender: NSObjectProtocol {
    /// `@property(readonly, nonatomic) BOOL canInsertDtmf;`
    var canInsertDtmf: Bool { get }
    /// `- (BOOL)insertDtmf:(nonnull NSString *)tones duration:(NSTimeInterval)duration interToneGap:(NSTimeInterval)interToneGap;`
    func insertDtmf(_ tones: String, duration: TimeInterval, interToneGap: TimeInterval) -> Bool
}

/// `@protocol RTCRtpSender <NSObject>` — imported as `RTCRtpSenderProtocol`, since the class below
/// has the same name.
public protocol RTCRtpSenderProtocol: NSObjectProtocol {
    /// `@property(nonatomic, copy) RTCRtpParameters *parameters;` — a copy: set it back to apply.
    var parameters: RTCRtpParameters { get set }
    /// `@property(nonatomic, readonly) NSString *senderId;`
    var senderId: String { get }
    /// `@property(nonatomic, copy, nullable) RTCMediaStreamTrack *track;`
    var track: RTCMediaStreamTrack? { get set }
    /// `@property(nonatomic, readonly, nullable) id<RTCDtmfSender> dtmfSender;`
    var dtmfSender: (any RTCDtmfSender)? { get }
}

/// `@interface RTCRtpSender : NSObject <RTCRtpSender>`
open class RTCRtpSender: NSObject, RTCRtpSenderProtocol {
    private let lock = NSLock()
    private var _parameters = RTCRtpParameters()
    private var _track: RTCMediaStreamTrack?
    private let dtmf = StandInDtmfSender()
    open private(set) var senderId = UUID().uuidString

    init(track: RTCMediaStreamTrack) { _track = track }

    open var parameters: RTCRtpParameters {
        get { lock.withLock { _parameters } }
        set { lock.withLock { _parameters = newValue } }
    }

    open var track: RTCMediaStreamTrack? {
        get { lock.withLock { _track } }
        set { lock.withLock { _track = newValue } }
    }

    open var dtmfSender: (any RTCDtmfSender)? { track?.kind == "audio" ? dtmf : nil }

    /// An offer and its answer are applied: the far side's audio section says whether DTMF can go.
    fileprivate func negotiationCompleted(remoteAudio: StandInMediaSection?) {
        dtmf.negotiationCompleted(telephoneEvents: remoteAudio.map { $0.telephoneEvents && $0.remoteReceives } ?? false)
    }

    /// Stand-in only: every tone inserted so far.
    public var standInTones: String { dtmf.tones }
}

/// `typedef NS_ENUM(NSInteger, RTCRtpMediaType)` (RTCRtpReceiver.h)
public enum RTCRtpMediaType: Int, Sendable {
    case audio, video, data, unsupported
}

/// `@protocol RTCRtpReceiver <NSObject>` — imported as `RTCRtpReceiverProtocol`, since the class
/// below has the same name.
public protocol RTCRtpReceiverProtocol: NSObjectProtocol {
    /// `@property(nonatomic, readonly) NSString *receiverId;`
    var receiverId: String { get }
    /// `@property(nonatomic, readonly, nullable) RTCMediaStreamTrack *track;` — the real one makes a
    /// new wrapper of the same track on every read ("Use isEqual: instead of =="): compare by `trackId`.
    var track: RTCMediaStreamTrack? { get }
}

/// `@interface RTCRtpReceiver : NSObject <RTCRtpReceiver>` — its track exists from the start, with
/// an id of libwebrtc's making (not the one in the remote `a=msid`).
open class RTCRtpReceiver: NSObject, RTCRtpReceiverProtocol {
    open private(set) var receiverId = UUID().uuidString
    open private(set) var track: RTCMediaStreamTrack?

    init(kind: RTCRtpMediaType) {
        if kind == .audio {
            track = RTCAudioTrack(source: RTCAudioSource(), trackId: UUID().uuidString)
        } else {
            track = RTCVideoTrack(trackId: UUID().uuidString)
        }
    }
}

/// `@protocol RTCRtpTransceiver <NSObject>` — imported as `RTCRtpTransceiverProtocol`.
public protocol RTCRtpTransceiverProtocol: NSObjectProtocol {
    /// `@property(nonatomic, readonly) RTCRtpMediaType mediaType;`
    var mediaType: RTCRtpMediaType { get }
    /// `@property(nonatomic, readonly) RTCRtpReceiver *receiver;`
    var receiver: RTCRtpReceiver { get }
}

/// `@interface RTCRtpTransceiver : NSObject <RTCRtpTransceiver>` (Unified Plan only): one made by
/// `addTrack`, or by a remote offer's m= section that no transceiver took.
open class RTCRtpTransceiver: NSObject, RTCRtpTransceiverProtocol {
    open private(set) var mediaType: RTCRtpMediaType
    open private(set) var receiver: RTCRtpReceiver
    /// The m= section it is associated with, once a description gave it one.
    var associatedMid: String?
    /// JSEP's [[FiredDirection]] has "recv": the delegate was told it started receiving.
    var receiving = false
    /// The remote streams its receiver's track is in.
    var remoteStreams: [RTCMediaStream] = []

    init(mediaType: RTCRtpMediaType) {
        self.mediaType = mediaType
        receiver = RTCRtpReceiver(kind: mediaType)
    }
}

/// One m= section of a remote description, as far as receiving goes: its media, mid (its position
/// when it has no `a=mid`), whether the remote side sends on it (not rejected, `a=sendrecv` or
/// `a=sendonly`, sendrecv when unsaid), the streams its `a=msid` lines name (`-`: none), and
/// whether it offers RFC 4733 telephone events (what DTMF needs).
private struct StandInMediaSection {
    var mediaType: RTCRtpMediaType?
    var rejected: Bool
    var mid: String
    var direction = "sendrecv"
    var streamIds: [String] = []
    var hasMsid = false
    var telephoneEvents = false

    var remoteSends: Bool { !rejected && (direction == "sendrecv" || direction == "sendonly") }
    var remoteReceives: Bool { !rejected && (direction == "sendrecv" || direction == "recvonly") }

    static func parse(_ sdp: String) -> [StandInMediaSection] {
        var sections: [StandInMediaSection] = []
        for line in sdp.split(whereSeparator: \.isNewline) {
            if line.hasPrefix("m=") {
                let fields = line.dropFirst(2).split(separator: " ")
                let kinds: [Substring: RTCRtpMediaType] = ["audio": .audio, "video": .video]
                sections.append(StandInMediaSection(mediaType: fields.first.flatMap { kinds[$0] },
                                                    rejected: fields.count > 1 && fields[1] == "0", mid: String(sections.count)))
            } else if !sections.isEmpty {
                let last = sections.count - 1
                if line.hasPrefix("a=mid:") {
                    sections[last].mid = String(line.dropFirst(6))
                } else if line.hasPrefix("a=rtpmap:"), line.lowercased().contains(" telephone-event/") {
                    sections[last].telephoneEvents = true
                } else if ["a=sendrecv", "a=sendonly", "a=recvonly", "a=inactive"].contains(line) {
                    sections[last].direction = String(line.dropFirst(2))
                } else if line.hasPrefix("a=msid:") {
                    sections[last].hasMsid = true
                    if let stream = line.dropFirst(7).split(separator: " ").first, stream != "-" {
                        sections[last].streamIds.append(String(stream))
                    }
                }
            }
        }
        return sections
    }
}

/// The DTMF sender of an audio sender (libwebrtc's `RTCDtmfSender` object, not public).
final class StandInDtmfSender: NSObject, RTCDtmfSender {
    private let lock = NSLock()
    private var inserted = ""
    private var negotiated = false

    /// libwebrtc's `AudioRtpSender::CanInsertDtmf`: a sender with an SSRC (a negotiation applied)
    /// whose send channel has a telephone-event payload type (the far side's description offered
    /// one) and sends (`WebRtcVoiceSendChannel::CanInsertDtmf`). Before the answer, or with a far
    /// side that offers no telephone events (a Parley Linux peer: GStreamer 1.22 sends none), no.
    var canInsertDtmf: Bool { lock.withLock { negotiated } }

    func negotiationCompleted(telephoneEvents: Bool) { lock.withLock { negotiated = telephoneEvents } }

    /// libwebrtc accepts 0-9 A-D # * and ',' (a 2 s pause); durations 40…6000 ms, gaps ≥ 30 ms;
    /// nothing while it cannot insert.
    func insertDtmf(_ tones: String, duration: TimeInterval, interToneGap: TimeInterval) -> Bool {
        guard canInsertDtmf, (0.04...6).contains(duration), interToneGap >= 0.03,
              tones.uppercased().allSatisfy({ "0123456789ABCD#*,".contains($0) }) else { return false }
        lock.withLock { inserted += tones }
        return true
    }

    var tones: String { lock.withLock { inserted } }
}

// MARK: RTCStatisticsReport.h

/// `@interface RTCStatistics : NSObject`
open class RTCStatistics: NSObject {
    /// `@property(nonatomic, readonly) NSString *id;`
    open private(set) var id: String
    /// `@property(nonatomic, readonly) CFTimeInterval timestamp_us;`
    open private(set) var timestamp_us: Double
    /// `@property(nonatomic, readonly) NSString *type;`
    open private(set) var type: String
    /// `@property(nonatomic, readonly) NSDictionary<NSString *, NSObject *> *values;`
    open private(set) var values: [String: NSObject]

    /// Stand-in only: statistics come from libwebrtc.
    public init(standInID id: String, type: String, timestamp_us: Double = 0, values: [String: NSObject]) {
        self.id = id
        self.type = type
        self.timestamp_us = timestamp_us
        self.values = values
    }
}

/// `@interface RTCStatisticsReport : NSObject`
open class RTCStatisticsReport: NSObject {
    /// `@property(nonatomic, readonly) CFTimeInterval timestamp_us;`
    open private(set) var timestamp_us: Double
    /// `@property(nonatomic, readonly) NSDictionary<NSString *, RTCStatistics *> *statistics;`
    open private(set) var statistics: [String: RTCStatistics]

    /// Stand-in only.
    public init(standInTimestamp timestamp_us: Double, statistics: [RTCStatistics]) {
        self.timestamp_us = timestamp_us
        self.statistics = Dictionary(statistics.map { ($0.id, $0) }, uniquingKeysWith: { $1 })
    }
}

// MARK: RTCPeerConnection.h

/// `typedef NS_ENUM(NSInteger, RTCSignalingState)`
public enum RTCSignalingState: Int, Sendable {
    case stable, haveLocalOffer, haveLocalPrAnswer, haveRemoteOffer, haveRemotePrAnswer, closed
}

/// `typedef NS_ENUM(NSInteger, RTCIceConnectionState)`
public enum RTCIceConnectionState: Int, Sendable {
    case new, checking, connected, completed, failed, disconnected, closed, count
}

/// `typedef NS_ENUM(NSInteger, RTCPeerConnectionState)`: ICE and DTLS together (W3C `RTCPeerConnectionState`).
public enum RTCPeerConnectionState: Int, Sendable {
    case new, connecting, connected, disconnected, failed, closed
}

/// `typedef NS_ENUM(NSInteger, RTCIceGatheringState)`
public enum RTCIceGatheringState: Int, Sendable {
    case new, gathering, complete
}

/// `@protocol RTCPeerConnectionDelegate <NSObject>`: the first nine are required; the others are
/// `@optional` and have empty defaults here (see CallKit's note on optional requirements).
/// `didRemoveStream` is "not called when RTCSdpSemanticsUnifiedPlan is specified".
public protocol RTCPeerConnectionDelegate: NSObjectProtocol {
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didChangeSignalingState:(RTCSignalingState)stateChanged;`
    func peerConnection(_ peerConnection: RTCPeerConnection, didChange stateChanged: RTCSignalingState)
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didAddStream:(RTCMediaStream *)stream;`
    func peerConnection(_ peerConnection: RTCPeerConnection, didAdd stream: RTCMediaStream)
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didRemoveStream:(RTCMediaStream *)stream;`
    func peerConnection(_ peerConnection: RTCPeerConnection, didRemove stream: RTCMediaStream)
    /// `- (void)peerConnectionShouldNegotiate:(RTCPeerConnection *)peerConnection;`
    func peerConnectionShouldNegotiate(_ peerConnection: RTCPeerConnection)
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didChangeIceConnectionState:(RTCIceConnectionState)newState;`
    func peerConnection(_ peerConnection: RTCPeerConnection, didChange newState: RTCIceConnectionState)
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didChangeIceGatheringState:(RTCIceGatheringState)newState;`
    func peerConnection(_ peerConnection: RTCPeerConnection, didChange newState: RTCIceGatheringState)
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didGenerateIceCandidate:(RTCIceCandidate *)candidate;`
    func peerConnection(_ peerConnection: RTCPeerConnection, didGenerate candidate: RTCIceCandidate)
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didRemoveIceCandidates:(NSArray<RTCIceCandidate *> *)candidates;`
    func peerConnection(_ peerConnection: RTCPeerConnection, didRemove candidates: [RTCIceCandidate])
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didOpenDataChannel:(RTCDataChannel *)dataChannel;`
    func peerConnection(_ peerConnection: RTCPeerConnection, didOpen dataChannel: RTCDataChannel)
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didStartReceivingOnTransceiver:(RTCRtpTransceiver *)transceiver;`
    /// (@optional; Unified Plan only) — W3C's `track` event, whether or not the track is in a stream.
    func peerConnection(_ peerConnection: RTCPeerConnection, didStartReceivingOn transceiver: RTCRtpTransceiver)
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didAddReceiver:(RTCRtpReceiver *)rtpReceiver
    ///    streams:(NSArray<RTCMediaStream *> *)mediaStreams;` (@optional)
    func peerConnection(_ peerConnection: RTCPeerConnection, didAdd rtpReceiver: RTCRtpReceiver, streams mediaStreams: [RTCMediaStream])
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didRemoveReceiver:(RTCRtpReceiver *)rtpReceiver;` (@optional)
    func peerConnection(_ peerConnection: RTCPeerConnection, didRemove rtpReceiver: RTCRtpReceiver)
    /// `- (void)peerConnection:(RTCPeerConnection *)peerConnection didChangeConnectionState:(RTCPeerConnectionState)newState;` (@optional)
    func peerConnection(_ peerConnection: RTCPeerConnection, didChange newState: RTCPeerConnectionState)
}

extension RTCPeerConnectionDelegate {
    public func peerConnection(_ peerConnection: RTCPeerConnection, didChange newState: RTCPeerConnectionState) {}
    public func peerConnection(_ peerConnection: RTCPeerConnection, didStartReceivingOn transceiver: RTCRtpTransceiver) {}
    public func peerConnection(_ peerConnection: RTCPeerConnection, didAdd rtpReceiver: RTCRtpReceiver, streams mediaStreams: [RTCMediaStream]) {}
    public func peerConnection(_ peerConnection: RTCPeerConnection, didRemove rtpReceiver: RTCRtpReceiver) {}
}

/// `@interface RTCDataChannel : NSObject` (only as the delegate above names it).
open class RTCDataChannel: NSObject {}

/// `@interface RTCPeerConnection : NSObject`
open class RTCPeerConnection: NSObject {
    private let lock = NSLock()
    private weak var _delegate: (any RTCPeerConnectionDelegate)?
    private var _signalingState: RTCSignalingState = .stable
    private var _senders: [RTCRtpSender] = []
    private var transceivers: [RTCRtpTransceiver] = []
    private var remoteStreams: [String: RTCMediaStream] = [:]
    /// The stream libwebrtc makes up for a remote description without any `a=msid`.
    private var defaultRemoteStream: RTCMediaStream?
    private var _records: [StandInRecord] = []
    private var _statistics = RTCStatisticsReport(standInTimestamp: 0, statistics: [])
    private var offerCount = 0
    /// The configuration it was made with.
    public let standInConfiguration: RTCConfiguration

    /// `@property(nonatomic, weak, nullable) id<RTCPeerConnectionDelegate> delegate;`
    open weak var delegate: (any RTCPeerConnectionDelegate)? {
        get { lock.withLock { _delegate } }
        set { lock.withLock { _delegate = newValue } }
    }

    /// `@property(nonatomic, readonly) RTCSignalingState signalingState;`
    open var signalingState: RTCSignalingState { lock.withLock { _signalingState } }
    /// `@property(nonatomic, readonly) NSArray<RTCRtpSender *> *senders;`
    open var senders: [RTCRtpSender] { lock.withLock { _senders } }

    init(configuration: RTCConfiguration, delegate: (any RTCPeerConnectionDelegate)?) {
        standInConfiguration = configuration
        _delegate = delegate
    }

    /// `- (nullable RTCRtpSender *)addTrack:(RTCMediaStreamTrack *)track streamIds:(NSArray<NSString *> *)streamIds;`
    /// — under Unified Plan, with a sendrecv transceiver of the track's kind.
    open func add(_ track: RTCMediaStreamTrack, streamIds: [String]) -> RTCRtpSender? {
        let sender = RTCRtpSender(track: track)
        lock.withLock {
            _senders.append(sender)
            transceivers.append(RTCRtpTransceiver(mediaType: track.kind == "audio" ? .audio : .video))
            _records.append(.addTrack(track.kind))
        }
        return sender
    }

    /// `- (void)offerForConstraints:(RTCMediaConstraints *)constraints completionHandler:
    ///    (nullable void (^)(RTCSessionDescription *_Nullable sdp, NSError *_Nullable error))completionHandler;`
    open func offer(for constraints: RTCMediaConstraints, completionHandler: @escaping @Sendable (RTCSessionDescription?, (any Error)?) -> Void) {
        let result: Result<RTCSessionDescription, StandInError> = lock.withLock {
            guard _signalingState == .stable || _signalingState == .haveLocalOffer else { return .failure(.wrongState("offer")) }
            offerCount += 1
            let restart = constraints.mandatory[kRTCMediaConstraintsIceRestart] == kRTCMediaConstraintsValueTrue
            _records.append(.createOffer(iceRestart: restart))
            return .success(RTCSessionDescription(type: .offer, sdp: "v=0\r\no=- \(offerCount) 2 IN IP4 127.0.0.1\r\n"))
        }
        switch result {
        case .success(let sdp): completionHandler(sdp, nil)
        case .failure(let error): completionHandler(nil, error)
        }
    }

    /// `- (void)answerForConstraints:(RTCMediaConstraints *)constraints completionHandler:(...)completionHandler;`
    open func answer(for constraints: RTCMediaConstraints, completionHandler: @escaping @Sendable (RTCSessionDescription?, (any Error)?) -> Void) {
        let allowed = lock.withLock { _signalingState == .haveRemoteOffer }
        guard allowed else { return completionHandler(nil, StandInError.wrongState("answer")) }
        lock.withLock { _records.append(.createAnswer) }
        completionHandler(RTCSessionDescription(type: .answer, sdp: "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\n"), nil)
    }

    /// `- (void)setLocalDescription:(RTCSessionDescription *)sdp completionHandler:(nullable void (^)(NSError *_Nullable error))completionHandler;`
    open func setLocalDescription(_ sdp: RTCSessionDescription, completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        transition(local: true, sdp, completionHandler)
    }

    /// `- (void)setRemoteDescription:(RTCSessionDescription *)sdp completionHandler:(...)completionHandler;`
    open func setRemoteDescription(_ sdp: RTCSessionDescription, completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        transition(local: false, sdp, completionHandler)
    }

    /// `- (void)addIceCandidate:(RTCIceCandidate *)candidate completionHandler:(void (^)(NSError *_Nullable error))completionHandler;`
    /// libwebrtc refuses a candidate before a remote description.
    open func add(_ candidate: RTCIceCandidate, completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        let error: StandInError? = lock.withLock {
            guard hasRemoteDescription else { return .noRemoteDescription }
            _records.append(.addCandidate(candidate.sdp))
            return nil
        }
        completionHandler(error)
    }

    /// `- (void)restartIce;`
    open func restartIce() {
        lock.withLock { _records.append(.restartIce) }
    }

    /// `- (void)close;`
    open func close() {
        let changed = lock.withLock { () -> Bool in
            _records.append(.close)
            guard _signalingState != .closed else { return false }
            _signalingState = .closed
            return true
        }
        if changed, let delegate { delegate.peerConnection(self, didChange: RTCSignalingState.closed) }
    }

    /// `- (void)statisticsWithCompletionHandler:(RTCStatisticsCompletionHandler)completionHandler;`
    open func statistics(completionHandler: @escaping @Sendable (RTCStatisticsReport) -> Void) {
        completionHandler(lock.withLock { _statistics })
    }

    private var hasRemoteDescription = false
    /// The audio section of the last remote description applied.
    private var remoteAudio: StandInMediaSection?

    private func transition(local: Bool, _ sdp: RTCSessionDescription, _ completion: @escaping @Sendable ((any Error)?) -> Void) {
        // The JSEP transitions libwebrtc allows (RFC 8829 §3.2); anything else is an error.
        let result: (StandInError?, RTCSignalingState?, Reception) = lock.withLock {
            let next: RTCSignalingState?
            switch (local, sdp.type, _signalingState) {
            case (true, .offer, .stable), (true, .offer, .haveLocalOffer): next = .haveLocalOffer
            case (false, .offer, .stable), (false, .offer, .haveRemoteOffer): next = .haveRemoteOffer
            case (true, .answer, .haveRemoteOffer): next = .stable
            case (false, .answer, .haveLocalOffer): next = .stable
            case (true, .rollback, .haveLocalOffer), (false, .rollback, .haveRemoteOffer): next = .stable
            default: next = nil
            }
            guard let next else { return (.wrongState("set \(local ? "local" : "remote") \(RTCSessionDescription.string(for: sdp.type))"), nil, Reception()) }
            if !local, sdp.type != .rollback {
                hasRemoteDescription = true
                remoteAudio = StandInMediaSection.parse(sdp.sdp).first { $0.mediaType == .audio }
            }
            if sdp.type == .answer {
                for sender in _senders where sender.track?.kind == "audio" { sender.negotiationCompleted(remoteAudio: remoteAudio) }
            }
            _records.append(local ? .setLocal(sdp.type) : .setRemote(sdp.type))
            let changed = next != _signalingState
            _signalingState = next
            let reception = !local && sdp.type != .rollback ? receiveLocked(sdp) : Reception()
            return (nil, changed ? next : nil, reception)
        }
        if let state = result.1, let delegate { delegate.peerConnection(self, didChange: state) }
        if let delegate {
            // libwebrtc's order: each transceiver's track event and its receiver, then the new streams, then what stopped.
            for transceiver in result.2.started {
                delegate.peerConnection(self, didStartReceivingOn: transceiver)
                delegate.peerConnection(self, didAdd: transceiver.receiver, streams: transceiver.remoteStreams)
            }
            for stream in result.2.addedStreams { delegate.peerConnection(self, didAdd: stream) }
            for receiver in result.2.stopped { delegate.peerConnection(self, didRemove: receiver) }
        }
        completion(result.0)
    }

    /// What a remote description changed in what is received.
    private struct Reception {
        var started: [RTCRtpTransceiver] = []
        var addedStreams: [RTCMediaStream] = []
        var stopped: [RTCRtpReceiver] = []
    }

    /// Applies a remote offer or answer to the transceivers (ApplyRemoteDescriptionUpdateTransceiverState).
    /// A section goes to the transceiver with its mid, else to the first of its media without one
    /// (one `addTrack` made); a remote offer makes a transceiver for a section none takes. Rollback
    /// does not undo what a rolled-back offer started.
    private func receiveLocked(_ sdp: RTCSessionDescription) -> Reception {
        var reception = Reception()
        let sections = StandInMediaSection.parse(sdp.sdp)
        let msidSignaled = sections.contains(where: \.hasMsid)
        for section in sections {
            guard let mediaType = section.mediaType else { continue }
            let transceiver: RTCRtpTransceiver
            if let found = transceivers.first(where: { $0.associatedMid == section.mid })
                ?? transceivers.first(where: { $0.associatedMid == nil && $0.mediaType == mediaType }) {
                transceiver = found
            } else if sdp.type == .offer {
                transceiver = RTCRtpTransceiver(mediaType: mediaType)
                transceivers.append(transceiver)
            } else {
                continue
            }
            transceiver.associatedMid = section.mid
            if section.remoteSends {
                transceiver.remoteStreams = remoteStreamsLocked(section.streamIds, msidSignaled: msidSignaled, added: &reception.addedStreams)
                if let track = transceiver.receiver.track {
                    for stream in transceiver.remoteStreams { stream.include(track) }
                }
                if !transceiver.receiving { reception.started.append(transceiver) }
            } else if transceiver.receiving {
                reception.stopped.append(transceiver.receiver)
            }
            transceiver.receiving = section.remoteSends
        }
        return reception
    }

    /// The remote streams of these ids, made when new. Without any `a=msid` in the description,
    /// libwebrtc puts every track in one stream of a random id; with `a=msid:-`, in none.
    private func remoteStreamsLocked(_ ids: [String], msidSignaled: Bool, added: inout [RTCMediaStream]) -> [RTCMediaStream] {
        if ids.isEmpty, !msidSignaled {
            if let stream = defaultRemoteStream { return [stream] }
            let stream = RTCMediaStream()
            defaultRemoteStream = stream
            added.append(stream)
            return [stream]
        }
        return ids.map { id in
            if let stream = remoteStreams[id] { return stream }
            let stream = RTCMediaStream()
            remoteStreams[id] = stream
            added.append(stream)
            return stream
        }
    }

    // MARK: Stand-in only

    public enum StandInRecord: Equatable, Sendable {
        case addTrack(String)
        case createOffer(iceRestart: Bool)
        case createAnswer
        case setLocal(RTCSdpType)
        case setRemote(RTCSdpType)
        case addCandidate(String)
        case restartIce
        case close
    }

    public enum StandInError: Error, Equatable {
        case wrongState(String)
        case noRemoteDescription
    }

    /// What was asked of the connection, in order.
    public var standInRecords: [StandInRecord] { lock.withLock { _records } }

    /// libwebrtc's statistics from now on.
    public func standInSetStatistics(_ report: RTCStatisticsReport) { lock.withLock { _statistics = report } }

    /// The network does something: an ICE state, a local candidate, negotiation needed.
    public func standInIceConnectionState(_ state: RTCIceConnectionState) {
        delegate?.peerConnection(self, didChange: state)
    }

    /// ICE and DTLS together, as libwebrtc reports it after the ICE state it follows.
    public func standInConnectionState(_ state: RTCPeerConnectionState) {
        delegate?.peerConnection(self, didChange: state)
    }

    public func standInGenerate(_ candidate: RTCIceCandidate) { delegate?.peerConnection(self, didGenerate: candidate) }
    public func standInGatheringComplete() { delegate?.peerConnection(self, didChange: RTCIceGatheringState.complete) }
    public func standInShouldNegotiate() { delegate?.peerConnectionShouldNegotiate(self) }

    /// The senders (parameters set, DTMF inserted).
    public var standInSenders: [RTCRtpSender] { lock.withLock { _senders } }

    /// The transceivers' receivers, whose tracks play the far side.
    public var standInReceivers: [RTCRtpReceiver] { lock.withLock { transceivers.map(\.receiver) } }
}

// MARK: RTCVideoCodecInfo.h, RTCVideoEncoderFactory.h, RTCVideoDecoderFactory.h, RTCDefaultVideo*Factory.h

/// `@interface RTCVideoCodecInfo : NSObject <NSCoding>`
open class RTCVideoCodecInfo: NSObject {
    /// `@property(nonatomic, readonly) NSString *name;`
    open private(set) var name: String

    /// `- (instancetype)initWithName:(NSString *)name;`
    public init(name: String) { self.name = name }
}

/// `@protocol RTCVideoEncoderFactory <NSObject>` (only what the stand-in reads)
public protocol RTCVideoEncoderFactory: NSObjectProtocol {
    /// `- (NSArray<RTCVideoCodecInfo *> *)supportedCodecs;`
    func supportedCodecs() -> [RTCVideoCodecInfo]
}

/// `@protocol RTCVideoDecoderFactory <NSObject>` (only what the stand-in reads)
public protocol RTCVideoDecoderFactory: NSObjectProtocol {
    /// `- (NSArray<RTCVideoCodecInfo *> *)supportedCodecs;`
    func supportedCodecs() -> [RTCVideoCodecInfo]
}

/// `@interface RTCDefaultVideoEncoderFactory : NSObject <RTCVideoEncoderFactory>`: every codec
/// bundled with WebRTC — H.264 (constrained high, then baseline), VP8, VP9 where it is supported
/// (RTCDefaultVideoEncoderFactory.m; the stand-in's phone supports it).
open class RTCDefaultVideoEncoderFactory: NSObject, RTCVideoEncoderFactory {
    override public init() {}
    open func supportedCodecs() -> [RTCVideoCodecInfo] { ["H264", "H264", "VP8", "VP9"].map(RTCVideoCodecInfo.init(name:)) }
}

/// `@interface RTCDefaultVideoDecoderFactory : NSObject <RTCVideoDecoderFactory>`
open class RTCDefaultVideoDecoderFactory: NSObject, RTCVideoDecoderFactory {
    override public init() {}
    open func supportedCodecs() -> [RTCVideoCodecInfo] { ["H264", "H264", "VP8", "VP9"].map(RTCVideoCodecInfo.init(name:)) }
}

// MARK: RTCPeerConnectionFactory.h

/// `@interface RTCPeerConnectionFactory : NSObject`
open class RTCPeerConnectionFactory: NSObject {
    private let lock = NSLock()
    private var made: [RTCPeerConnection] = []
    private let videoCodecs: [String]

    /// `- (instancetype)init;` — "with default H264 video encoder/decoder factories"
    /// (RTCPeerConnectionFactory.mm: `RTCVideoEncoderFactoryH264`): H.264 only.
    override public init() {
        videoCodecs = ["H264"]
    }

    /// `- (instancetype)initWithEncoderFactory:(nullable id<RTCVideoEncoderFactory>)encoderFactory
    ///    decoderFactory:(nullable id<RTCVideoDecoderFactory>)decoderFactory;`
    public init(encoderFactory: (any RTCVideoEncoderFactory)?, decoderFactory: (any RTCVideoDecoderFactory)?) {
        let encoders = Set(encoderFactory?.supportedCodecs().map(\.name) ?? [])
        let decoders = Set(decoderFactory?.supportedCodecs().map(\.name) ?? [])
        videoCodecs = (encoderFactory?.supportedCodecs().map(\.name) ?? []).filter { encoders.contains($0) && decoders.contains($0) }
    }

    /// `- (RTCAudioSource *)audioSourceWithConstraints:(nullable RTCMediaConstraints *)constraints;`
    open func audioSource(with constraints: RTCMediaConstraints?) -> RTCAudioSource { RTCAudioSource() }

    /// `- (RTCVideoSource *)videoSource;`
    open func videoSource() -> RTCVideoSource { RTCVideoSource() }

    /// `- (RTCVideoTrack *)videoTrackWithSource:(RTCVideoSource *)source trackId:(NSString *)trackId;`
    open func videoTrack(with source: RTCVideoSource, trackId: String) -> RTCVideoTrack { RTCVideoTrack(trackId: trackId) }

    /// `- (RTCAudioTrack *)audioTrackWithSource:(RTCAudioSource *)source trackId:(NSString *)trackId;`
    open func audioTrack(with source: RTCAudioSource, trackId: String) -> RTCAudioTrack {
        RTCAudioTrack(source: source, trackId: trackId)
    }

    /// `- (nullable RTCPeerConnection *)peerConnectionWithConfiguration:(RTCConfiguration *)configuration
    ///    constraints:(RTCMediaConstraints *)constraints delegate:(nullable id<RTCPeerConnectionDelegate>)delegate;`
    open func peerConnection(with configuration: RTCConfiguration, constraints: RTCMediaConstraints,
                             delegate: (any RTCPeerConnectionDelegate)?) -> RTCPeerConnection? {
        let connection = RTCPeerConnection(configuration: configuration, delegate: delegate)
        lock.withLock { made.append(connection) }
        return connection
    }

    // MARK: Stand-in only

    /// The video codecs both of the factory's encoder and decoder factories have, in order.
    public var standInVideoCodecs: [String] { videoCodecs }

    /// Every peer connection this factory made.
    public var standInPeerConnections: [RTCPeerConnection] { lock.withLock { made } }
}
