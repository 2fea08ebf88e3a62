import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import AVFoundation
import NetworkStandIn
@testable import ParleyApple
import ParleyKit
import ParleyLocalServices
import ParleyProtocol
import Testing
import WebRTC

@Suite("WebRTC adapter")
struct WebRTCAdapterTests {
    func connection() async throws -> (WebRTCPeerConnection, RTCPeerConnection) {
        let factory = RTCPeerConnectionFactory()
        let adapter = WebRTCPeerConnectionFactory(factory: factory)
        let port = try await adapter.makePeerConnection(PeerConnectionConfiguration(
            iceServers: [IceServer(urls: ["turn:turn.example.net:3478?transport=udp"], username: "u", credential: "p")], relayOnly: true))
        let rtc = try #require(factory.standInPeerConnections.first)
        return (try #require(port as? WebRTCPeerConnection), rtc)
    }

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
    }

    @Test func muteHoldBitrateAndDTMFReachTheTracksAndTheSender() async throws {
        let (peer, rtc) = try await connection()
        let microphone = try #require(rtc.standInSenders.first?.track)
        let remote = RTCMediaStream.standInRemoteAudio("far")
        rtc.standInAddRemote(remote)
        await peer.setMicrophoneMuted(true)
        #expect(!microphone.isEnabled)
        await peer.setOnHold(true)
        #expect(!microphone.isEnabled)
        #expect(remote.audioTracks.allSatisfy { !$0.isEnabled }, "the far side is not played while held")
        await peer.setOnHold(false)
        #expect(!microphone.isEnabled, "resuming keeps a muted microphone muted")
        #expect(remote.audioTracks.allSatisfy { $0.isEnabled })
        await peer.setMicrophoneMuted(false)
        #expect(microphone.isEnabled)

        await peer.setAudioEncoding(BitrateController.Setting(bitrateKbps: 24, fec: true, expectedLossPct: 10))
        #expect(rtc.standInSenders.first?.parameters.encodings.first?.maxBitrateBps == NSNumber(value: 24000))

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
        defer { RTCCameraVideoCapturer.standInDevices.withLock { $0 = [] } }
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
        let capturing = try #require(peer.cameraCapturer?.standInCapturing)
        #expect(capturing.device == "front" && capturing.width == 640 && capturing.height == 480 && capturing.fps == 30)
        let remote = RTCMediaStream.standInRemoteVideo("far")
        rtc.standInAddRemote(remote)
        #expect(peer.remoteVideoTrack === remote.videoTracks.first)
        // Hold stops the camera's track from sending; resume sends it again.
        await peer.setOnHold(true)
        #expect(!local.isEnabled)
        await peer.setOnHold(false)
        #expect(local.isEnabled)
        // Offers ask for video.
        _ = try await peer.createOffer(iceRestart: false)

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
        #expect(peer.cameraCapturer?.standInCapturing == nil, "closing the call stops the camera")
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
                return inbox.removeFirst()
            }
            if let next { continuation.resume(with: next) }
        }
    }

    func cancel(with closeCode: URLSessionWebSocketTask.CloseCode, reason: Data?) { lock.withLock { cancelled = closeCode } }

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

@Suite("Network path monitor")
struct NetworkPathMonitorTests {
    @Test func onlyAChangeOfUsableNetworkCounts() async throws {
        let changes = Counter()
        let monitor = NetworkPathMonitor { changes.add() }
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
}

final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    var value: Int { lock.withLock { count } }
    func add() { lock.withLock { count += 1 } }
}
