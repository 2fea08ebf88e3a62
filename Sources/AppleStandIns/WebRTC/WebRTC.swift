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
// and lets a test play the network (delegate events, statistics). Hooks are marked "Stand-in only".

import AVFoundation
import Foundation
import StandInSupport

// MARK: RTCSessionDescription.h

/// `typedef NS_ENUM(NSInteger, RTCSdpType)`
public enum RTCSdpType: Int, Sendable {
    case offer, prAnswer, answer, rollback
}

/// `@interface RTCSessionDescription : NSObject`
open class RTCSessionDescription: NSObject, @unchecked Sendable {
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
open class RTCIceCandidate: NSObject, @unchecked Sendable {
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
open class RTCIceServer: NSObject, @unchecked Sendable {
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
open class RTCConfiguration: NSObject, @unchecked Sendable {
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
open class RTCMediaConstraints: NSObject, @unchecked Sendable {
    let mandatory: [String: String]

    /// `- (instancetype)initWithMandatoryConstraints:(nullable NSDictionary<NSString *, NSString *> *)mandatory
    ///    optionalConstraints:(nullable NSDictionary<NSString *, NSString *> *)optional NS_DESIGNATED_INITIALIZER;`
    public init(mandatoryConstraints mandatory: [String: String]?, optionalConstraints optional: [String: String]?) {
        self.mandatory = mandatory ?? [:]
    }
}

// MARK: RTCMediaStreamTrack.h, RTCAudioTrack.h, RTCAudioSource.h, RTCMediaStream.h

/// `@interface RTCMediaStreamTrack : NSObject`
open class RTCMediaStreamTrack: NSObject, @unchecked Sendable {
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
open class RTCAudioSource: NSObject, @unchecked Sendable {}

/// `@interface RTCAudioTrack : RTCMediaStreamTrack`
open class RTCAudioTrack: RTCMediaStreamTrack, @unchecked Sendable {
    /// `@property(nonatomic, readonly) RTCAudioSource *source;`
    open private(set) var source: RTCAudioSource

    init(source: RTCAudioSource, trackId: String) {
        self.source = source
        super.init(kind: "audio", trackId: trackId)
    }
}

// MARK: RTCVideoRenderer.h, RTCVideoCapturer.h, RTCVideoSource.h, RTCVideoTrack.h, RTCCameraVideoCapturer.h

/// `@interface RTCVideoFrame : NSObject` (only as renderers receive it).
open class RTCVideoFrame: NSObject, @unchecked Sendable {}

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
open class RTCVideoCapturer: NSObject, @unchecked Sendable {
    /// `@property(nonatomic, weak) id<RTCVideoCapturerDelegate> delegate;`
    open weak var delegate: (any RTCVideoCapturerDelegate)?

    /// `- (instancetype)initWithDelegate:(id<RTCVideoCapturerDelegate>)delegate;`
    public init(delegate: any RTCVideoCapturerDelegate) { self.delegate = delegate }
}

/// `@interface RTCVideoSource : RTCMediaSource <RTCVideoCapturerDelegate>`
open class RTCVideoSource: NSObject, RTCVideoCapturerDelegate, @unchecked Sendable {
    open func capturer(_ capturer: RTCVideoCapturer, didCapture frame: RTCVideoFrame) {}
}

/// `@interface RTCVideoTrack : RTCMediaStreamTrack`
open class RTCVideoTrack: RTCMediaStreamTrack, @unchecked Sendable {
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
open class RTCCameraVideoCapturer: RTCVideoCapturer, @unchecked Sendable {
    private let lock = NSLock()
    private var capturing: (device: AVCaptureDevice, format: AVCaptureDevice.Format, fps: Int)?

    /// `+ (NSArray<AVCaptureDevice *> *)captureDevices;`
    open class func captureDevices() -> [AVCaptureDevice] { standInDevices.withLock { $0 } }

    /// `+ (NSArray<AVCaptureDeviceFormat *> *)supportedFormatsForDevice:(AVCaptureDevice *)device;`
    open class func supportedFormats(for device: AVCaptureDevice) -> [AVCaptureDevice.Format] { device.formats }

    /// `- (void)startCaptureWithDevice:(AVCaptureDevice *)device format:(AVCaptureDeviceFormat *)format
    ///    fps:(NSInteger)fps completionHandler:(nullable void (^)(NSError *_Nullable))completionHandler;`
    open func startCapture(with device: AVCaptureDevice, format: AVCaptureDevice.Format, fps: Int,
                           completionHandler: (@Sendable ((any Error)?) -> Void)? = nil) {
        lock.withLock { capturing = (device, format, fps) }
        completionHandler?(nil)
    }

    /// `- (void)stopCaptureWithCompletionHandler:(nullable void (^)(void))completionHandler;`
    open func stopCapture(completionHandler: (@Sendable () -> Void)? = nil) {
        lock.withLock { capturing = nil }
        completionHandler?()
    }

    // MARK: Stand-in only

    /// The cameras this "device" has.
    public static let standInDevices = StandInLockedBox<[AVCaptureDevice]>([])

    /// What it captures now: the device's id, the format's size, the frame rate.
    public var standInCapturing: (device: String, width: Int32, height: Int32, fps: Int)? {
        lock.withLock {
            capturing.map { ($0.device.uniqueID, CMVideoFormatDescriptionGetDimensions($0.format.formatDescription).width,
                             CMVideoFormatDescriptionGetDimensions($0.format.formatDescription).height, $0.fps) }
        }
    }
}

/// `@interface RTCMediaStream : NSObject`
open class RTCMediaStream: NSObject, @unchecked Sendable {
    /// `@property(nonatomic, readonly) NSArray<RTCAudioTrack *> *audioTracks;`
    open private(set) var audioTracks: [RTCAudioTrack]
    /// `@property(nonatomic, readonly) NSArray<RTCVideoTrack *> *videoTracks;`
    open private(set) var videoTracks: [RTCVideoTrack] = []

    /// Stand-in only: remote streams come from libwebrtc.
    public init(standInAudioTracks audioTracks: [RTCAudioTrack], videoTracks: [RTCVideoTrack] = []) {
        self.audioTracks = audioTracks
        self.videoTracks = videoTracks
    }

    /// Stand-in only: a remote audio and video stream.
    public static func standInRemoteVideo(_ trackId: String) -> RTCMediaStream {
        RTCMediaStream(standInAudioTracks: [RTCAudioTrack(source: RTCAudioSource(), trackId: trackId + "-audio")],
                       videoTracks: [RTCVideoTrack(trackId: trackId)])
    }

    /// Stand-in only: a remote audio track.
    public static func standInRemoteAudio(_ trackId: String) -> RTCMediaStream {
        RTCMediaStream(standInAudioTracks: [RTCAudioTrack(source: RTCAudioSource(), trackId: trackId)])
    }
}

// MARK: RTCRtpEncodingParameters.h, RTCRtpParameters.h, RTCDtmfSender.h, RTCRtpSender.h, RTCRtpReceiver.h, RTCRtpTransceiver.h

/// `@interface RTCRtpEncodingParameters : NSObject`
open class RTCRtpEncodingParameters: NSObject, @unchecked Sendable {
    /// `@property(nonatomic, assign) BOOL isActive;`
    open var isActive = true
    /// `@property(nonatomic, copy, nullable) NSNumber *maxBitrateBps;`
    open var maxBitrateBps: NSNumber?

    override public init() {}
}

/// `@interface RTCRtpParameters : NSObject`
open class RTCRtpParameters: NSObject, @unchecked Sendable {
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
open class RTCRtpSender: NSObject, RTCRtpSenderProtocol, @unchecked Sendable {
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

    /// Stand-in only: every tone inserted so far.
    public var standInTones: String { dtmf.tones }
}

/// The DTMF sender of an audio sender (libwebrtc's `RTCDtmfSender` object, not public).
final class StandInDtmfSender: NSObject, RTCDtmfSender, @unchecked Sendable {
    private let lock = NSLock()
    private var inserted = ""

    var canInsertDtmf: Bool { true }

    /// libwebrtc accepts 0-9 A-D # * and ',' (a 2 s pause); durations 40…6000 ms, gaps ≥ 30 ms.
    func insertDtmf(_ tones: String, duration: TimeInterval, interToneGap: TimeInterval) -> Bool {
        guard (0.04...6).contains(duration), interToneGap >= 0.03,
              tones.uppercased().allSatisfy({ "0123456789ABCD#*,".contains($0) }) else { return false }
        lock.withLock { inserted += tones }
        return true
    }

    var tones: String { lock.withLock { inserted } }
}

// MARK: RTCStatisticsReport.h

/// `@interface RTCStatistics : NSObject`
open class RTCStatistics: NSObject, @unchecked Sendable {
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
open class RTCStatisticsReport: NSObject, @unchecked Sendable {
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

/// `typedef NS_ENUM(NSInteger, RTCIceGatheringState)`
public enum RTCIceGatheringState: Int, Sendable {
    case new, gathering, complete
}

/// `@protocol RTCPeerConnectionDelegate <NSObject>`: the first nine are required; the others are
/// `@optional` and have empty defaults here (see CallKit's note on optional requirements).
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
}

/// `@interface RTCDataChannel : NSObject` (only as the delegate above names it).
open class RTCDataChannel: NSObject, @unchecked Sendable {}

/// `@interface RTCPeerConnection : NSObject`
open class RTCPeerConnection: NSObject, @unchecked Sendable {
    private let lock = NSLock()
    private weak var _delegate: (any RTCPeerConnectionDelegate)?
    private var _signalingState: RTCSignalingState = .stable
    private var _senders: [RTCRtpSender] = []
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
    open func add(_ track: RTCMediaStreamTrack, streamIds: [String]) -> RTCRtpSender? {
        let sender = RTCRtpSender(track: track)
        lock.withLock {
            _senders.append(sender)
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

    private func transition(local: Bool, _ sdp: RTCSessionDescription, _ completion: @escaping @Sendable ((any Error)?) -> Void) {
        // The JSEP transitions libwebrtc allows (RFC 8829 §3.2); anything else is an error.
        let result: (StandInError?, RTCSignalingState?) = lock.withLock {
            let next: RTCSignalingState?
            switch (local, sdp.type, _signalingState) {
            case (true, .offer, .stable), (true, .offer, .haveLocalOffer): next = .haveLocalOffer
            case (false, .offer, .stable), (false, .offer, .haveRemoteOffer): next = .haveRemoteOffer
            case (true, .answer, .haveRemoteOffer): next = .stable
            case (false, .answer, .haveLocalOffer): next = .stable
            case (true, .rollback, .haveLocalOffer), (false, .rollback, .haveRemoteOffer): next = .stable
            default: next = nil
            }
            guard let next else { return (.wrongState("set \(local ? "local" : "remote") \(RTCSessionDescription.string(for: sdp.type))"), nil) }
            if !local, sdp.type != .rollback { hasRemoteDescription = true }
            _records.append(local ? .setLocal(sdp.type) : .setRemote(sdp.type))
            let changed = next != _signalingState
            _signalingState = next
            return (nil, changed ? next : nil)
        }
        if let state = result.1, let delegate { delegate.peerConnection(self, didChange: state) }
        completion(result.0)
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

    public func standInGenerate(_ candidate: RTCIceCandidate) { delegate?.peerConnection(self, didGenerate: candidate) }
    public func standInGatheringComplete() { delegate?.peerConnection(self, didChange: RTCIceGatheringState.complete) }
    public func standInShouldNegotiate() { delegate?.peerConnectionShouldNegotiate(self) }
    public func standInAddRemote(_ stream: RTCMediaStream) { delegate?.peerConnection(self, didAdd: stream) }

    /// The senders (parameters set, DTMF inserted).
    public var standInSenders: [RTCRtpSender] { lock.withLock { _senders } }
}

// MARK: RTCPeerConnectionFactory.h

/// `@interface RTCPeerConnectionFactory : NSObject`
open class RTCPeerConnectionFactory: NSObject, @unchecked Sendable {
    private let lock = NSLock()
    private var made: [RTCPeerConnection] = []

    /// `- (instancetype)init;`
    override public init() {}

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

    /// Every peer connection this factory made.
    public var standInPeerConnections: [RTCPeerConnection] { lock.withLock { made } }
}
