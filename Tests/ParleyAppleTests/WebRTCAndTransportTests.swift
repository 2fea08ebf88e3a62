import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import AVFoundation
import Logging
import NetworkStandIn
@testable import ParleyApple
import ParleyKit
import ParleyLocalServices
import ParleyProtocol
import Testing
import WebRTC

extension OneIPhone {
    /// Serialized: the cameras and the camera permission are the process's.
    @Suite("WebRTC adapter", .serialized)
    struct WebRTCAdapterTests {
        /// The adapter's warnings (a camera that does not start) are what some tests are about, not output.
        static var quiet: Logger {
            var logger = Logger(label: "test.webrtc")
            logger.logLevel = .critical
            return logger
        }

        func connection(video: Bool = false) async throws -> (WebRTCPeerConnection, RTCPeerConnection) {
            let factory = RTCPeerConnectionFactory()
            let adapter = WebRTCPeerConnectionFactory(factory: factory, logger: Self.quiet)
            let port = try await adapter.makePeerConnection(PeerConnectionConfiguration(
                iceServers: [IceServer(urls: ["turn:turn.example.net:3478?transport=udp"], username: "u", credential: "p")], relayOnly: true,
                media: MediaSpec(audio: true, video: video)))
            let rtc = try #require(factory.standInPeerConnections.first)
            return (try #require(port as? WebRTCPeerConnection), rtc)
        }

        /// A remote description as a browser writes it, with one m= section per entry: its media, its
        /// `a=msid` line (nil: none), its direction.
        /// `telephoneEvents`: the audio section offers RFC 4733 events (Chromium's and WebRTC's do).
        static func remote(_ sections: [(media: String, msid: String?, direction: String)], telephoneEvents: Bool = false) -> String {
            var sdp = "v=0\r\no=- 4611731400430051336 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
            sdp += "a=group:BUNDLE \(sections.indices.map(String.init).joined(separator: " "))\r\na=msid-semantic: WMS\r\n"
            for (mid, section) in sections.enumerated() {
                let events = telephoneEvents ? " 126" : "", eventMap = telephoneEvents ? "\r\na=rtpmap:126 telephone-event/8000" : ""
                let codec = section.media == "audio" ? "111\(events)\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:111 opus/48000/2\(eventMap)" : "96\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:96 VP8/90000"
                sdp += "m=\(section.media) 9 UDP/TLS/RTP/SAVPF \(codec)\r\na=mid:\(mid)\r\na=\(section.direction)\r\n"
                if let msid = section.msid { sdp += "a=msid:\(msid)\r\n" }
            }
            return sdp
        }

        /// The tracks the connection receives on, of one kind.
        static func received(_ rtc: RTCPeerConnection, _ kind: String) -> [RTCMediaStreamTrack] {
            rtc.standInReceivers.compactMap(\.track).filter { $0.kind == kind }
        }

        static var cameras: [AVCaptureDevice] { [
            AVCaptureDevice(standInID: "back", name: "Back Camera", position: .back, formats: [AVCaptureDevice.Format(standInWidth: 640, height: 480, maxFrameRate: 30)]),
            AVCaptureDevice(standInID: "front", name: "Front Camera", position: .front, formats: [AVCaptureDevice.Format(standInWidth: 640, height: 480, maxFrameRate: 30)]),
        ] }

        @Test func theConfigurationIsWhatTheCoreAskedFor() async throws {
            let (_, rtc) = try await connection()
            let configuration = rtc.standInConfiguration
            #expect(configuration.iceTransportPolicy == .relay)
            #expect(configuration.sdpSemantics == .unifiedPlan)
            #expect(configuration.continualGatheringPolicy == .gatherContinually)
            #expect(configuration.iceServers.first?.urlStrings == ["turn:turn.example.net:3478?transport=udp"])
            #expect(configuration.iceServers.first?.credential == "p")
            #expect(rtc.standInRecords.first == .addTrack("audio"))
        }

        @Test func negotiationGoesThroughLibwebrtcsStateMachine() async throws {
            let (peer, rtc) = try await connection()
            let offer = try await peer.createOffer(iceRestart: true)
            #expect(offer.type == "offer")
            #expect(rtc.standInRecords.contains(.createOffer(iceRestart: true)))
            try await peer.setLocalDescription(offer)
            #expect(await peer.signalingState() == .haveLocalOffer)
            // A candidate before the remote description is refused, as libwebrtc refuses it.
            await #expect(throws: (any Error).self) { try await peer.addRemoteCandidate(IceCandidate(candidate: "candidate:1 1 udp 1 127.0.0.1 9 typ host")) }
            try await peer.rollback()
            #expect(await peer.signalingState() == .stable)
            try await peer.setRemoteDescription(SessionDescription(type: "offer", sdp: "v=0\r\n"))
            let answer = try await peer.createAnswer()
            try await peer.setLocalDescription(answer)
            #expect(await peer.signalingState() == .stable)
            try await peer.addRemoteCandidate(IceCandidate(candidate: "candidate:1 1 udp 1 127.0.0.1 9 typ host", sdpMid: "0", sdpMLineIndex: 0))
            try await peer.addRemoteCandidate(nil)
            #expect(rtc.standInRecords.contains(.addCandidate("candidate:1 1 udp 1 127.0.0.1 9 typ host")))
            // An answer in `stable` is an error, not a crash.
            await #expect(throws: (any Error).self) { try await peer.createAnswer() }
        }

        @Test func eventsComeFromTheDelegate() async throws {
            let (peer, rtc) = try await connection()
            var events = peer.events.makeAsyncIterator()
            rtc.standInShouldNegotiate()
            #expect(await events.next() == .negotiationNeeded(id: 1))
            #expect(await peer.shouldNegotiate(1))
            rtc.standInShouldNegotiate()
            #expect(await events.next() == .negotiationNeeded(id: 2))
            #expect(await !peer.shouldNegotiate(1), "a later negotiation-needed supersedes it")
            rtc.standInGenerate(RTCIceCandidate(sdp: "candidate:2 1 udp 5 10.0.0.1 5000 typ host", sdpMLineIndex: 0, sdpMid: "0"))
            #expect(await events.next() == .localCandidate(IceCandidate(candidate: "candidate:2 1 udp 5 10.0.0.1 5000 typ host", sdpMid: "0", sdpMLineIndex: 0)))
            rtc.standInGatheringComplete()
            #expect(await events.next() == .localCandidate(nil))
            rtc.standInIceConnectionState(.connected)
            #expect(await events.next() == .iceConnectionState(.connected))
            rtc.standInConnectionState(.connected)
            #expect(await events.next() == .connectionState(.connected), "ICE and DTLS up: what the call waits for")
        }

        @Test func muteHoldBitrateAndDTMFReachTheTracksAndTheSender() async throws {
            let (peer, rtc) = try await connection()
            let microphone = try #require(rtc.standInSenders.first?.track)
            try await peer.setRemoteDescription(SessionDescription(type: "offer", sdp: Self.remote([("audio", "far far-audio", "sendrecv")])))
            let remote = Self.received(rtc, "audio")
            #expect(remote.count == 1)
            await peer.setMicrophoneMuted(true)
            #expect(!microphone.isEnabled)
            await peer.setOnHold(true)
            #expect(!microphone.isEnabled)
            #expect(remote.allSatisfy { !$0.isEnabled }, "the far side is not played while held")
            await peer.setOnHold(false)
            #expect(!microphone.isEnabled, "resuming keeps a muted microphone muted")
            #expect(remote.allSatisfy { $0.isEnabled })
            await peer.setMicrophoneMuted(false)
            #expect(microphone.isEnabled)

            await peer.setAudioEncoding(BitrateController.Setting(bitrateKbps: 24, fec: true, expectedLossPct: 10))
            #expect(rtc.standInSenders.first?.parameters.encodings.first?.maxBitrateBps == NSNumber(value: 24000))

            // DTMF as libwebrtc allows it: not before the answer is applied, nor to a far side that
            // offers no telephone events (a Parley Linux peer), then yes.
            #expect(!peer.canSendDTMF, "no answer applied yet")
            await #expect(throws: (any Error).self) { try await peer.sendDTMF("1") }
            try await peer.setLocalDescription(try await peer.createAnswer())
            #expect(!peer.canSendDTMF, "the far side offered no telephone events")
            try await peer.setRemoteDescription(SessionDescription(type: "offer", sdp: Self.remote([("audio", "far far-audio", "sendrecv")], telephoneEvents: true)))
            try await peer.setLocalDescription(try await peer.createAnswer())
            #expect(peer.canSendDTMF, "the audio sender's dtmfSender says it can insert")
            try await peer.sendDTMF("12#")
            #expect(rtc.standInSenders.first?.standInTones == "12#")
            await #expect(throws: (any Error).self) { try await peer.sendDTMF("hello") }
        }

        @Test func aVideoCallCapturesTheFrontCameraAtASensibleFormatAndShowsTheFarSide() async throws {
            let formats = [
                AVCaptureDevice.Format(standInWidth: 352, height: 288, maxFrameRate: 30),
                AVCaptureDevice.Format(standInWidth: 640, height: 480, maxFrameRate: 30),
                AVCaptureDevice.Format(standInWidth: 1280, height: 720, maxFrameRate: 60),
                AVCaptureDevice.Format(standInWidth: 1920, height: 1080, maxFrameRate: 30),
            ]
            RTCCameraVideoCapturer.standInDevices.withLock {
                $0 = [AVCaptureDevice(standInID: "back", name: "Back Camera", position: .back, formats: formats),
                      AVCaptureDevice(standInID: "front", name: "Front Camera", position: .front, formats: formats)]
            }
            AVCaptureDevice.standInSetAuthorization(.authorized, for: .video)
            defer {
                RTCCameraVideoCapturer.standInDevices.withLock { $0 = [] }
                AVCaptureDevice.standInSetAuthorization(.notDetermined, for: .video)
            }
            let factory = RTCPeerConnectionFactory()
            let adapter = WebRTCPeerConnectionFactory(factory: factory)
            let port = try await adapter.makePeerConnection(PeerConnectionConfiguration(iceServers: [], media: MediaSpec(audio: true, video: true)))
            let peer = try #require(port as? WebRTCPeerConnection)
            let rtc = try #require(factory.standInPeerConnections.first)
            #expect(rtc.standInRecords.prefix(2) == [.addTrack("audio"), .addTrack("video")])
            var made = adapter.peerConnections.makeAsyncIterator()
            #expect(await made.next() === peer, "the app learns of the connection, for its video views")
            let local = try #require(peer.localVideoTrack)
            #expect(local.kind == "video")
            #expect(peer.cameraFailure == nil)
            let capturing = try #require(peer.cameraCapturer?.standInCapturing)
            #expect(capturing.device == "front" && capturing.width == 640 && capturing.height == 480 && capturing.fps == 30)
            // Offers ask for video.
            _ = try await peer.createOffer(iceRestart: false)
            try await peer.setRemoteDescription(SessionDescription(type: "offer", sdp: Self.remote([
                ("audio", "far far-audio", "sendrecv"), ("video", "far far-video", "sendrecv"),
            ])))
            #expect(peer.remoteVideoTrack?.trackId == Self.received(rtc, "video").first?.trackId)
            // Hold stops the camera's track from sending; resume sends it again.
            await peer.setOnHold(true)
            #expect(!local.isEnabled)
            await peer.setOnHold(false)
            #expect(local.isEnabled)

            // The format: the smallest that is at least 640×480 at 30 fps; with none, the biggest there is.
            let chosen = try #require(Camera.format(formats))
            #expect(CMVideoFormatDescriptionGetDimensions(chosen.0.formatDescription) == CMVideoDimensions(width: 640, height: 480))
            #expect(chosen.1 == 30)
            let small = [AVCaptureDevice.Format(standInWidth: 320, height: 240, maxFrameRate: 15),
                         AVCaptureDevice.Format(standInWidth: 352, height: 288, maxFrameRate: 15)]
            let fallback = try #require(Camera.format(small))
            #expect(CMVideoFormatDescriptionGetDimensions(fallback.0.formatDescription).width == 352)
            #expect(fallback.1 == 15, "never more frames than the format does")
            #expect(Camera.format([]) == nil)
            await peer.close()
            try await eventually("closing the call stops the camera") { peer.cameraCapturer?.standInRunning == false }
        }

        /// Under Unified Plan a remote track arrives on a transceiver, in a stream or not: a peer that
        /// adds its tracks without one (`a=msid:-`, a browser's `addTrack(track)`) is heard and seen too.
        @Test func remoteTracksArriveWithoutAStream() async throws {
            let (peer, rtc) = try await connection(video: true)
            try await peer.setRemoteDescription(SessionDescription(type: "offer", sdp: Self.remote([
                ("audio", "- 7d9b3e2a", "sendrecv"), ("video", "- 1f4c8a60", "sendrecv"),
            ])))
            let audio = Self.received(rtc, "audio")
            let video = try #require(Self.received(rtc, "video").first)
            #expect(peer.remoteVideoTrack?.trackId == video.trackId, "the far side's video, in no stream")
            await peer.setOnHold(true)
            #expect(audio.count == 1 && audio.allSatisfy { !$0.isEnabled }, "the far side's audio, in no stream, is held too")
            await peer.setOnHold(false)
            #expect(audio.allSatisfy { $0.isEnabled })
            await peer.close()
        }

        /// A description without any `a=msid` (an older or non-browser peer): libwebrtc makes up a
        /// stream; the tracks come as they do from a browser. A peer that stops sending its video takes it away.
        @Test func remoteTracksArriveWithoutMsidAndLeaveWhenThePeerStopsSending() async throws {
            let (peer, rtc) = try await connection(video: true)
            try await peer.setRemoteDescription(SessionDescription(type: "offer", sdp: Self.remote([
                ("audio", nil, "sendrecv"), ("video", nil, "sendrecv"),
            ])))
            let video = try #require(Self.received(rtc, "video").first)
            #expect(peer.remoteVideoTrack?.trackId == video.trackId)
            let answer = try await peer.createAnswer()
            try await peer.setLocalDescription(answer)
            try await peer.setRemoteDescription(SessionDescription(type: "offer", sdp: Self.remote([
                ("audio", nil, "sendrecv"), ("video", nil, "recvonly"),
            ])))
            #expect(peer.remoteVideoTrack == nil, "the far side turned its camera off")
            await peer.close()
        }

        /// Without camera access the capturer would start, capture nothing and say nothing: it is not
        /// started, and the connection says why, as it does when the camera cannot start.
        @Test func theCameraStartsOnlyWithCameraAccessAndSaysWhyNot() async throws {
            RTCCameraVideoCapturer.standInDevices.withLock { $0 = Self.cameras }
            defer {
                RTCCameraVideoCapturer.standInDevices.withLock { $0 = [] }
                RTCCameraVideoCapturer.standInLockError.withLock { $0 = nil }
                AVCaptureDevice.standInSetAuthorization(.notDetermined, for: .video)
            }
            for (refused, words) in [(AVAuthorizationStatus.notDetermined, "not granted yet"), (.denied, "turned off"), (.restricted, "restricted")] {
                AVCaptureDevice.standInSetAuthorization(refused, for: .video)
                let (peer, _) = try await connection(video: true)
                try await eventually("the camera's start is settled") { peer.cameraFailure != nil }
                #expect(peer.cameraCapturer?.standInRunning == false, "no capture session without camera access (\(refused))")
                #expect(peer.cameraFailure?.description.contains("camera access is \(words)") == true)
                await peer.close()
            }

            AVCaptureDevice.standInSetAuthorization(.authorized, for: .video)
            RTCCameraVideoCapturer.standInLockError.withLock { $0 = NSError(domain: "AVFoundationErrorDomain", code: -11_804) }
            let factory = RTCPeerConnectionFactory()
            let adapter = WebRTCPeerConnectionFactory(factory: factory, logger: Self.quiet)
            let port = try await adapter.makePeerConnection(PeerConnectionConfiguration(iceServers: [], media: MediaSpec(audio: true, video: true)))
            var made = adapter.peerConnections.makeAsyncIterator()
            let busy = try #require(await made.next())
            #expect(busy === port as? WebRTCPeerConnection)
            #expect(busy.cameraFailure?.description.contains("the camera did not start") == true, "settled when the app gets the connection")
            await busy.close()

            RTCCameraVideoCapturer.standInLockError.withLock { $0 = nil }
            RTCCameraVideoCapturer.standInDevices.withLock { $0 = [] }
            let (cameraless, _) = try await connection(video: true)
            #expect(cameraless.cameraFailure?.description == "this device has no camera")
            await cameraless.close()

            let (audio, _) = try await connection()
            #expect(audio.cameraCapturer == nil && audio.cameraFailure == nil, "an audio call has no camera to start")
            await audio.close()
        }


        @Test func statisticsMapToTheCoresSampleAndTheFirstPacketsSayAudioStarted() async throws {
            let (peer, rtc) = try await connection()
            rtc.standInSetStatistics(RTCStatisticsReport(standInTimestamp: 1, statistics: [
                RTCStatistics(standInID: "IT01A", type: "inbound-rtp", values: [
                    "kind": "audio" as NSString, "packetsReceived": NSNumber(value: 480), "packetsLost": NSNumber(value: 12),
                    "jitter": NSNumber(value: 0.015), "bytesReceived": NSNumber(value: 38_000), "audioLevel": NSNumber(value: 0.25),
                ]),
                RTCStatistics(standInID: "IT01V", type: "inbound-rtp", values: ["kind": "video" as NSString, "packetsReceived": NSNumber(value: 900)]),
                RTCStatistics(standInID: "OT01A", type: "outbound-rtp", values: ["kind": "audio" as NSString, "bytesSent": NSNumber(value: 40_000)]),
                RTCStatistics(standInID: "RI01A", type: "remote-inbound-rtp", values: ["kind": "audio" as NSString, "roundTripTime": NSNumber(value: 0.082)]),
                RTCStatistics(standInID: "CP01", type: "candidate-pair", values: ["nominated": NSNumber(value: true), "currentRoundTripTime": NSNumber(value: 0.5)]),
            ]))
            var events = peer.events.makeAsyncIterator()
            let sample = try await peer.statistics()
            #expect(sample.packetsReceived == 480, "video packets do not count")
            #expect(sample.packetsLost == 12)
            #expect(abs((sample.jitterMs ?? 0) - 15) < 0.001)
            #expect(sample.bytesReceived == 38_000)
            #expect(sample.bytesSent == 40_000)
            #expect(abs((sample.roundTripTimeMs ?? 0) - 82) < 0.001, "RTCP's round trip over the candidate pair's")
            #expect(sample.audioLevel == 0.25)
            #expect(await events.next() == .remoteAudioStarted)

            // Before RTCP reports, the candidate pair's round trip stands in.
            let early = WebRTCPeerConnection.sample(RTCStatisticsReport(standInTimestamp: 1, statistics: [
                RTCStatistics(standInID: "CP01", type: "candidate-pair", values: ["nominated": NSNumber(value: true), "currentRoundTripTime": NSNumber(value: 0.04)]),
            ]), at: .zero)
            #expect(abs((early.roundTripTimeMs ?? 0) - 40) < 0.001)
            #expect(early.packetsReceived == 0)
        }
    }
}

/// A `URLSessionWebSocketTask` played by the test.
final class ScriptedWebSocketTask: WebSocketTask, @unchecked Sendable {
    private let lock = NSLock()
    private var inbox: [Result<URLSessionWebSocketTask.Message, any Error>] = []
    private var waiting: CheckedContinuation<URLSessionWebSocketTask.Message, any Error>?
    private(set) var sent: [String] = []
    private(set) var cancelled: URLSessionWebSocketTask.CloseCode?
    var closeCodeNumber = 0

    struct Closed: Error {}

    func send(_ message: URLSessionWebSocketTask.Message) async throws {
        if case .string(let text) = message { lock.withLock { sent.append(text) } }
    }

    func receive() async throws -> URLSessionWebSocketTask.Message {
        try await withCheckedThrowingContinuation { continuation in
            let next: Result<URLSessionWebSocketTask.Message, any Error>? = lock.withLock {
                if inbox.isEmpty { waiting = continuation; return nil }
                // Once cancelled, the failure stays for every receive after.
                return cancelled != nil && inbox.count == 1 ? inbox[0] : inbox.removeFirst()
            }
            if let next { continuation.resume(with: next) }
        }
    }

    /// As URLSession does: a cancelled task's pending receive fails, and so does every later one.
    func cancel(with closeCode: URLSessionWebSocketTask.CloseCode, reason: Data?) {
        let waiter = lock.withLock { () -> CheckedContinuation<URLSessionWebSocketTask.Message, any Error>? in
            cancelled = closeCode
            inbox = [.failure(URLError(.cancelled))]
            defer { waiting = nil }
            return waiting
        }
        waiter?.resume(throwing: URLError(.cancelled))
    }

    func deliver(_ result: Result<URLSessionWebSocketTask.Message, any Error>) {
        let waiter = lock.withLock { () -> CheckedContinuation<URLSessionWebSocketTask.Message, any Error>? in
            if let waiting { self.waiting = nil; return waiting }
            inbox.append(result)
            return nil
        }
        waiter?.resume(with: result)
    }

    /// The server closes with `code`: the pending receive fails and the task knows the code.
    func serverClose(_ code: Int) {
        lock.withLock { closeCodeNumber = code }
        deliver(.failure(Closed()))
    }
}

extension OneIPhone {
    @Suite("URLSession signaling transport")
    struct URLSessionTransportTests {
        @Test func framesGoOutInOrderAndEveryMessageIsReceived() async throws {
            let task = ScriptedWebSocketTask()
            let connection = URLSessionSignalingConnection(task: task)
            for index in 0..<50 { connection.send("frame \(index)") }
            try await eventually("all sent") { task.sent.count == 50 }
            #expect(task.sent == (0..<50).map { "frame \($0)" })
            var events = connection.events.makeAsyncIterator()
            for index in 0..<3 { task.deliver(.success(.string("server \(index)"))) }
            task.deliver(.success(.data(Data([1, 2]))))  // not protocol v1: dropped
            task.deliver(.success(.string("after binary")))
            for index in 0..<3 { #expect(await events.next() == .text("server \(index)")) }
            #expect(await events.next() == .text("after binary"), "the receive is re-armed after every message")
            task.serverClose(4009)
            #expect(await events.next() == .closed(code: 4009), "the protocol's own close codes come through")
            #expect(await events.next() == nil)
        }

        @Test func closeCodesMapAsTheNIOTransportMapsThem() async throws {
            #expect(URLSessionSignalingConnection.closeCode(1001) == 1001)
            #expect(URLSessionSignalingConnection.closeCode(4010) == 4010)
            #expect(URLSessionSignalingConnection.closeCode(0) == nil, "invalid: no close frame")
            #expect(URLSessionSignalingConnection.closeCode(1006) == nil, "abnormal closure: the connection died")
            let task = ScriptedWebSocketTask()
            let connection = URLSessionSignalingConnection(task: task)
            connection.close()
            #expect(task.cancelled == .normalClosure)
        }
    }
}

extension OneIPhone {
    @Suite("Network path monitor")
    struct NetworkPathMonitorTests {
        @Test func onlyAChangeOfUsableNetworkCounts() async throws {
            let changes = Counter()
            let monitor = NetworkPathMonitor()
            let counting = Task { for await _ in monitor.changes { changes.add() } }
            defer { counting.cancel() }
            monitor.start()
            let wifi = NWPath(standInStatus: .satisfied, interfaces: [NWInterface(standInType: .wifi, name: "en0")])
            let cellular = NWPath(standInStatus: .satisfied, interfaces: [NWInterface(standInType: .cellular, name: "pdp_ip0")])
            let none = NWPath(standInStatus: .unsatisfied, interfaces: [])
            try await Task.sleep(for: .milliseconds(50))  // the first path, delivered at start, is not a change
            NWPathMonitor.standInChange(to: wifi)
            try await Task.sleep(for: .milliseconds(50))
            #expect(changes.value == 0, "the same network again")
            NWPathMonitor.standInChange(to: cellular)
            try await eventually("Wi-Fi to cellular") { changes.value == 1 }
            NWPathMonitor.standInChange(to: none)
            try await Task.sleep(for: .milliseconds(50))
            #expect(changes.value == 1, "losing the network is not a network to reconnect on")
            NWPathMonitor.standInChange(to: wifi)
            try await eventually("back on Wi-Fi") { changes.value == 2 }
            monitor.stop()
        }

        /// Only the interface the path sends through (the first of `availableInterfaces`) and the IP
        /// versions it has make it another network: cellular or a VPN's tunnel coming and going beside
        /// Wi-Fi is no reason to restart ICE. Compared without a monitor: a path change reaches every
        /// monitor in the process, the running phones' of other suites too.
        @Test func interfacesBesideTheOneInUseDoNotCount() {
            let wifi = NWInterface(standInType: .wifi, name: "en0")
            let cellular = NWInterface(standInType: .cellular, name: "pdp_ip0")
            let tunnel = NWInterface(standInType: .other, name: "utun3")
            func network(_ interfaces: [NWInterface], ipv6: Bool = true) -> NetworkPathMonitor.PathSummary {
                NetworkPathMonitor.PathSummary(NWPath(standInStatus: .satisfied, interfaces: interfaces, supportsIPv6: ipv6))
            }
            for beside in [[wifi, cellular], [wifi, cellular, tunnel], [wifi, tunnel]] {
                #expect(network(beside) == network([wifi]), "Wi-Fi carries the traffic beside \(beside.dropFirst().map(\.name))")
            }
            #expect(network([wifi, cellular], ipv6: false) != network([wifi, cellular]), "Wi-Fi lost its IPv6 addresses")
            #expect(network([cellular, wifi]) != network([wifi, cellular]), "cellular carries the traffic now")
            #expect(network([cellular]) == network([cellular, wifi]), "Wi-Fi leaving once cellular carries the traffic changes nothing")
        }
    }
}

final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    var value: Int { lock.withLock { count } }
    func add() { lock.withLock { count += 1 } }
}
