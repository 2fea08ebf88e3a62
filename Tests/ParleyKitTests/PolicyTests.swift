import Foundation
@testable import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import Testing

@Suite("Audio route and interruption policy")
struct AudioRoutePolicyTests {
    @Test func aNewDeviceIsUsedAndTheOldOnesLossFallsBack() {
        var policy = AudioRoutePolicy(video: false)
        #expect(policy.current == .receiver)
        let step1 = policy.handle(.newDeviceAvailable(.bluetooth("AirPods")))
        #expect(step1 == [.route(to: .bluetooth("AirPods")), .show(.bluetooth("AirPods"))])
        let step2 = policy.handle(.newDeviceAvailable(.wiredHeadset))
        #expect(step2 == [.route(to: .wiredHeadset), .show(.wiredHeadset)])
        let step3 = policy.handle(.oldDeviceUnavailable(.wiredHeadset))
        #expect(step3 == [.route(to: .bluetooth("AirPods")), .show(.bluetooth("AirPods"))],
                "back to the Bluetooth headset that is still there")
        let step4 = policy.handle(.oldDeviceUnavailable(.bluetooth("AirPods")))
        #expect(step4 == [.route(to: .receiver), .show(.receiver)])
        #expect(AudioRoutePolicy(video: true).current == .speaker, "video calls default to the speaker")
    }

    @Test func theSpeakerButtonIsAnOverrideThatAHeadsetCancels() {
        var policy = AudioRoutePolicy(video: false)
        let step5 = policy.handle(.speakerButton(on: true))
        #expect(step5 == [.overrideToSpeaker(true), .show(.speaker)])
        let step6 = policy.handle(.speakerButton(on: true))
        #expect(step6 == [])
        let step7 = policy.handle(.newDeviceAvailable(.wiredHeadset))
        #expect(step7 == [.overrideToSpeaker(false), .route(to: .wiredHeadset), .show(.wiredHeadset)])
        #expect(!policy.speakerOverride)
        _ = policy.handle(.speakerButton(on: true))
        let step8 = policy.handle(.speakerButton(on: false))
        #expect(step8 == [.overrideToSpeaker(false), .show(.wiredHeadset)])
    }

    @Test func anotherCallHoldsAndResumesThisOne() {
        var policy = AudioRoutePolicy(video: false)
        let step9 = policy.handle(.beganByCall)
        #expect(step9 == [.pauseMedia, .holdCall])
        let step10 = policy.handle(.categoryChange)
        #expect(step10 == [], "no fighting over the session while interrupted")
        let step11 = policy.handle(.ended(shouldResume: true))
        #expect(step11 == [.reconfigureSession, .resumeMedia, .unholdCall])
    }

    @Test func aSystemInterruptionPausesAndMayWaitForTheUser() {
        var policy = AudioRoutePolicy(video: false)
        let step12 = policy.handle(.beganBySystem)
        #expect(step12 == [.pauseMedia])
        let step13 = policy.handle(.ended(shouldResume: false))
        #expect(step13 == [.showPausedAwaitingUser])
        #expect(policy.interrupted)
        let step14 = policy.userResumed()
        #expect(step14 == [.reconfigureSession, .resumeMedia])
        let step15 = policy.userResumed()
        #expect(step15 == [])
    }

    @Test func mediaServicesResetRebuildsAudioOnTheSameRoute() {
        var policy = AudioRoutePolicy(video: false)
        _ = policy.handle(.speakerButton(on: true))
        let step16 = policy.handle(.mediaServicesReset)
        #expect(step16 == [.reconfigureSession, .restartAudio, .route(to: .speaker), .overrideToSpeaker(true)])
        let step17 = policy.handle(.categoryChange)
        #expect(step17 == [.reconfigureSession])
    }
}

@Suite("Call quality and bitrate")
struct QualityTests {
    @Test func eModelMatchesItsReferencePoints() {
        // No impairment but Opus's own (Ie 11) and the codec's delay: R = 93.2 − 0.024 · 26.5 − 11 ≈ 81.56.
        let clean = EModel.opus.rating(rttMs: 0, jitterMs: 0, lossPct: 0)
        #expect(abs(clean - 81.564) < 0.01)
        #expect(abs(EModel.mos(rating: clean) - 4.08) < 0.01)
        #expect(EModel.score(rating: clean) == 4)
        // 5 % random loss with Bpl 19: Ie,eff − Ie = (95 − 11) · 5 / 24 = 17.5.
        let lossy = EModel.opus.rating(rttMs: 0, jitterMs: 0, lossPct: 5)
        #expect(abs(clean - lossy - 84.0 * 5 / 24) < 0.001)
        // Opus below 20 kbit/s: 5 more per kbit/s (at 12, Ie = 11 + 40); from 20 up, Ie as it is.
        #expect(EModel.opus.impairment(atKbps: 12) == 51)
        #expect(EModel.opus.impairment(atKbps: 32) == 11 && EModel.opus.impairment(atKbps: nil) == 11)
        #expect(abs(EModel.opus.rating(rttMs: 0, jitterMs: 0, lossPct: 0, codecKbps: 12) - (clean - 40)) < 0.001)
        // Delay past 177.3 ms one way costs more steeply.
        let slow = EModel.opus.rating(rttMs: 400, jitterMs: 0, lossPct: 0)
        #expect(abs((clean - slow) - (0.024 * 200 + 0.11 * (226.5 - 177.3))) < 0.001)
        #expect(EModel.mos(rating: -5) == 1)
        #expect(EModel.mos(rating: 120) == 4.5)
        #expect(EModel.score(rating: 65) == 2)
    }

    /// Figures published in the recommendations themselves, not recomputed from our formula.
    @Test func eModelAgreesWithG107AndG113PublishedFigures() {
        // G.107: the default parameter set gives R = 93.2 (MOS 4.41); its R → MOS mapping (Annex B)
        // at the user-satisfaction band edges: 90 → 4.34, 80 → 4.03, 70 → 3.60, 60 → 3.10, 50 → 2.58.
        let noDelay = EModel(equipmentImpairment: 0, packetLossRobustness: 25.1, codecDelayMs: 0)
        #expect(abs(noDelay.rating(rttMs: 0, jitterMs: 0, lossPct: 0) - 93.2) < 0.05)
        for (rating, mos) in [(93.2, 4.41), (90.0, 4.34), (80.0, 4.03), (70.0, 3.60), (60.0, 3.10), (50.0, 2.58)] {
            #expect(abs(EModel.mos(rating: rating) - mos) < 0.01, "R \(rating)")
        }
        // G.113 Appendix I: G.729A (+VAD) has Ie = 11, Bpl = 19; with no loss and no delay R = 93.2 − 11 = 82.2.
        let g729a = EModel(equipmentImpairment: 11, packetLossRobustness: 19, codecDelayMs: 0)
        #expect(abs(g729a.rating(rttMs: 0, jitterMs: 0, lossPct: 0) - 82.2) < 0.05)
    }

    /// G.107's BurstR: loss in runs weighs more than the same loss scattered; random loss is 1.
    @Test func burstyLossWeighsMoreThanRandomLoss() throws {
        // 10 % loss, 10 packets lost in 10 runs of one: random (mean run 1 · 0.9 → held at 1).
        #expect(EModel.burstRatio(lostPackets: 10, runs: 10, lossPct: 10) == 1)
        // The same 10 in runs of 3.33: BurstR = 3.33 · (1 − 0.1) = 3.
        #expect(abs(EModel.burstRatio(lostPackets: 10, runs: 3, lossPct: 10) - 3) < 0.001)
        #expect(EModel.burstRatio(lostPackets: 0, runs: 0, lossPct: 0) == 1)
        // Ie,eff = Ie + (95 − Ie) · Ppl / (Ppl / BurstR + Bpl).
        let random = EModel.opus.listeningRating(lossPct: 10)
        let bursty = EModel.opus.listeningRating(lossPct: 10, burstRatio: 3)
        #expect(abs((93.2 - bursty) - (11 + 84 * 10 / (10.0 / 3 + 19))) < 0.001)
        #expect(bursty < random)

        // The monitor takes the runs from the engine's counters, interval by interval.
        var monitor = QualityMonitor(window: 1)
        _ = monitor.add(MediaStatsSample(at: .seconds(0)))
        let scatteredReport = monitor.add(MediaStatsSample(at: .seconds(1), packetsReceived: 45, packetsLost: 5, gapPackets: 5, gapRuns: 5))
        let clumpedReport = monitor.add(MediaStatsSample(at: .seconds(2), packetsReceived: 90, packetsLost: 10, gapPackets: 10, gapRuns: 6))
        let scattered = try #require(scatteredReport)
        let clumped = try #require(clumpedReport)
        #expect(scattered.burstRatio == 1)
        #expect(abs(clumped.burstRatio - 4.5) < 0.001, "5 lost in one run, at 10 %: 5 · 0.9")
        #expect(clumped.listeningMos < scattered.listeningMos)
    }

    /// The codec's bitrate is the highest received in the last ten seconds: a pause does not read as
    /// a codec starved of bits, a path squeezed to 12 kbit/s does.
    @Test func theCodecBitrateIsTheHighestOfTenSeconds() throws {
        var monitor = QualityMonitor(window: 1)
        var reports: [QualityReport] = []
        var bytes = 0
        _ = monitor.add(MediaStatsSample(at: .zero))
        for second in 1...24 {
            // 32 kbit/s of speech for 4 s, 3 kbit/s of pause for 4 s, then 12 kbit/s from 8 s on.
            bytes += (second <= 4 ? 4_000 : second <= 8 ? 375 : 1_500)
            let report = monitor.add(MediaStatsSample(at: .seconds(second), packetsReceived: 50 * second, bytesReceived: bytes))
            reports.append(try #require(report))
        }
        #expect(reports[6].codecKbps == 32, "a pause keeps the speech's bitrate")
        #expect(reports[6].listeningMos == reports[0].listeningMos)
        #expect(reports[23].codecKbps == 12, "ten seconds of 12 kbit/s are 12 kbit/s")
        #expect(reports[23].listeningMos < reports[0].listeningMos - 0.5)
    }

    /// An interval with nothing received says so (`receivedPackets` 0): the manager shows no MOS for
    /// it, rather than the perfect one of a call with no loss and no jitter that nobody heard. What
    /// the far side reports of our packets still reaches the encoder.
    @Test func anIntervalWithNoPacketReceivedSaysSo() throws {
        var monitor = QualityMonitor(window: 2)
        _ = monitor.add(MediaStatsSample(at: .seconds(0)))
        let silentReport = monitor.add(MediaStatsSample(at: .seconds(1), roundTripTimeMs: 40, bytesSent: 4000, remoteLossPct: 8, packetsSent: 50))
        let silent = try #require(silentReport)
        #expect(silent.receivedPackets == 0)
        #expect(silent.remoteLossPct == 8)
        let resumedReport = monitor.add(MediaStatsSample(at: .seconds(2), roundTripTimeMs: 40, packetsReceived: 50, bytesSent: 8000,
                                                         bytesReceived: 4000, packetsSent: 100))
        let resumed = try #require(resumedReport)
        #expect(resumed.receivedPackets == 50)
    }

    /// Silence is `silenceAfter` without a packet, from the first reading on (a call that never
    /// receives anything counts), said once; packets again are said once too.
    @Test func mediaArrivalsSayWhenPacketsStopAndComeBack() {
        var never = MediaArrivals(silenceAfter: .seconds(5))
        #expect(never.add(MediaStatsSample(at: .seconds(0))) == nil)
        #expect(never.add(MediaStatsSample(at: .seconds(4))) == nil)
        #expect(never.add(MediaStatsSample(at: .seconds(5))) == false, "nothing since the call connected")
        #expect(never.add(MediaStatsSample(at: .seconds(7))) == nil, "said once")

        var arrivals = MediaArrivals(silenceAfter: .seconds(5))
        #expect(arrivals.add(MediaStatsSample(at: .seconds(0), packetsReceived: 10)) == nil)
        #expect(arrivals.add(MediaStatsSample(at: .seconds(2), packetsReceived: 110)) == nil)
        #expect(arrivals.add(MediaStatsSample(at: .seconds(6), packetsReceived: 110)) == nil, "four seconds without")
        #expect(arrivals.add(MediaStatsSample(at: .seconds(7), packetsReceived: 110)) == false)
        #expect(arrivals.add(MediaStatsSample(at: .seconds(8), packetsReceived: 111)) == true)
        #expect(arrivals.add(MediaStatsSample(at: .seconds(9), packetsReceived: 160)) == nil)
        // The engine forgot the far side's source in the silence and counts afresh when it is back.
        #expect(arrivals.add(MediaStatsSample(at: .seconds(15), packetsReceived: 0)) == false)
        #expect(arrivals.add(MediaStatsSample(at: .seconds(16), packetsReceived: 40)) == true)
    }

    @Test func theMonitorTurnsCountersIntoSmoothedIntervals() throws {
        var monitor = QualityMonitor(window: 2)
        let step18 = monitor.add(MediaStatsSample(at: .seconds(0)))
        #expect(step18 == nil)
        let firstReport = monitor.add(MediaStatsSample(at: .seconds(1), roundTripTimeMs: 40, jitterMs: 5,
                                                       packetsReceived: 95, packetsLost: 5, bytesReceived: 4000))
        let first = try #require(firstReport)
        #expect(first.lossPct == 5)
        #expect(first.bitrateKbps == 32)
        let secondReport = monitor.add(MediaStatsSample(at: .seconds(2), roundTripTimeMs: 40, jitterMs: 5,
                                                        packetsReceived: 195, packetsLost: 5, bytesReceived: 8000))
        let second = try #require(secondReport)
        #expect(second.lossPct == 2.5, "smoothed over the window")
        #expect(second.mos > first.mos)
        #expect(second.callQuality.lossPct == 2.5)
    }

    /// Where retransmission repairs every loss the far side reports none; its asks for packets
    /// again still tell the encoder what the network drops.
    @Test func theFarSidesAsksForPacketsAgainCountAsItsLoss() throws {
        var monitor = QualityMonitor(window: 1)
        _ = monitor.add(MediaStatsSample(at: .seconds(0), remoteLossPct: 0, packetsSent: 0))
        // Both ways carry packets: an interval with nothing received is not rated at all.
        let repairedReport = monitor.add(MediaStatsSample(at: .seconds(1), packetsReceived: 50, remoteLossPct: 0, packetsSent: 50, retransmissionsAsked: 5))
        let repaired = try #require(repairedReport)
        #expect(repaired.remoteLossPct == 10)
        let reportedReport = monitor.add(MediaStatsSample(at: .seconds(2), packetsReceived: 100, remoteLossPct: 12, packetsSent: 100, retransmissionsAsked: 6))
        let reported = try #require(reportedReport)
        #expect(reported.remoteLossPct == 12, "the larger of the two")
        var fresh = QualityMonitor(window: 1)
        _ = fresh.add(MediaStatsSample(at: .seconds(0)))
        let beforeReport = fresh.add(MediaStatsSample(at: .seconds(1), packetsReceived: 50, packetsSent: 50))
        let before = try #require(beforeReport)
        #expect(before.remoteLossPct == nil, "nothing heard from the far side yet")
    }

    /// Unwraps the setting a controller was expected to change to.
    func changed(_ setting: BitrateController.Setting?, sourceLocation: SourceLocation = #_sourceLocation) throws -> BitrateController.Setting {
        try #require(setting, sourceLocation: sourceLocation)
    }

    @Test func randomLossTurnsFECOnAndGivesItBitsWithoutLoweringTheBitrate() throws {
        var controller = BitrateController()
        #expect(controller.setting.bitrateKbps == 32)
        // FEC on at once, and the bitrate up to 48 kbit/s at once for it.
        let first = try changed(controller.update(lossPct: 8, rttMs: 40, now: .seconds(1)))
        #expect(first.fec && first.expectedLossPct == 8 && first.bitrateKbps == 48 && first.frameMs == 20)
        // The round trip stays at its base: nothing queues, so sending less would not help.
        for second in 2..<12 {
            #expect(controller.update(lossPct: 8, rttMs: 42, now: .seconds(second)) == nil)
        }
        #expect(controller.setting.bitrateKbps == 48 && controller.baseRttMs == 40)
        // Heavier random loss raises the hint, not the cost.
        let heavier = try changed(controller.update(lossPct: 20, rttMs: 42, now: .seconds(12)))
        #expect(heavier.bitrateKbps == 48 && heavier.expectedLossPct == 20)
        #expect(controller.update(lossPct: 20, rttMs: 42, now: .seconds(13)) == nil)
    }

    @Test func fecThatCameOnBeforeAnyRoundTripGetsItsBitsOnceOneIsMeasured() throws {
        var controller = BitrateController()
        let early = try changed(controller.update(lossPct: 8, rttMs: nil, now: .seconds(1)))
        #expect(early.fec && early.bitrateKbps == 32, "no boost on a path not yet measured")
        let boosted = try changed(controller.update(lossPct: 8, rttMs: 40, now: .seconds(2)))
        #expect(boosted.bitrateKbps == 48)
    }

    /// The monitor feeds the controller as the call manager does: the first reports come before any
    /// RTCP report, and must not leave the controller a base round trip below the real one.
    @Test func reportsBeforeTheFirstRoundTripDoNotSkewTheBase() throws {
        var monitor = QualityMonitor()
        var controller = BitrateController()
        var settings: [BitrateController.Setting] = []
        for second in 0...12 {
            let rtt: Double? = second < 4 ? nil : 100
            let sample = MediaStatsSample(at: .seconds(second), roundTripTimeMs: rtt, packetsReceived: 47 * second,
                                          packetsLost: 3 * second, bytesReceived: 4_000 * second)
            guard let report = monitor.add(sample) else { continue }
            #expect((report.latestRttMs == nil) == (second < 4))
            if let setting = controller.update(lossPct: report.lossPct, rttMs: report.latestRttMs, now: sample.at) { settings.append(setting) }
        }
        // 6 % random loss on a 100 ms path that does not queue: FEC with its bits, never a decrease.
        #expect(controller.baseRttMs == 100)
        #expect(settings.last?.bitrateKbps == 48 && settings.last?.fec == true, "\(settings)")
        #expect(settings.allSatisfy { $0.bitrateKbps >= 32 })
    }

    @Test func lowBitratesSendLongerFrames() throws {
        var controller = BitrateController()
        _ = controller.update(lossPct: 0, rttMs: 40, now: .seconds(0))
        var frames: [Double: Int] = [:]
        for second in 1..<30 {
            if let setting = controller.update(lossPct: 8, rttMs: 200, now: .seconds(second)) { frames[setting.bitrateKbps] = setting.frameMs }
        }
        #expect(frames[24] == 20 && frames[18] == 40 && frames[13.5] == 60 && frames[12] == 60, "\(frames)")
    }

    @Test func congestionLowersTheBitrateAndItRecoversWithoutOscillating() throws {
        var controller = BitrateController()
        #expect(controller.update(lossPct: 0, rttMs: 40, now: .seconds(1)) == nil, "one clean report is not enough to rise")
        // A bottleneck: loss, with the round trip 100 ms above its base. FEC turns on at once;
        // one congested report is not enough to lower the rate (hysteresis).
        let fec = try changed(controller.update(lossPct: 8, rttMs: 140, now: .seconds(2)))
        #expect(fec.fec && fec.bitrateKbps == 32)
        let down = try changed(controller.update(lossPct: 8, rttMs: 150, now: .seconds(3)))
        #expect(down.bitrateKbps == 24)
        // Hold-off: no second decrease within 2 s.
        #expect(controller.update(lossPct: 8, rttMs: 150, now: .seconds(4)) == nil)
        let further = try changed(controller.update(lossPct: 8, rttMs: 150, now: .seconds(5)))
        #expect(further.bitrateKbps == 18)
        // Clean again: FEC off at once, but no increase until confirmed and past the 6 s hold-off.
        let clean = try changed(controller.update(lossPct: 0, rttMs: 45, now: .seconds(6)))
        #expect(!clean.fec && clean.bitrateKbps == 18)
        #expect(controller.update(lossPct: 0, rttMs: 45, now: .seconds(7)) == nil)
        #expect(controller.update(lossPct: 0, rttMs: 45, now: .seconds(10)) == nil)
        let up = try changed(controller.update(lossPct: 0, rttMs: 45, now: .seconds(11)))
        #expect(abs(up.bitrateKbps - 20.7) < 0.001)

        // A long path (300 ms from the start, no queue) blocks increases.
        var far = BitrateController()
        for second in 0..<20 { #expect(far.update(lossPct: 0, rttMs: 300, now: .seconds(second)) == nil) }
    }

    @Test func aDeepQueueDropsTheBitrateToItsFloorAtOnce() throws {
        var controller = BitrateController()
        _ = controller.update(lossPct: 0, rttMs: 40, now: .seconds(1))
        _ = controller.update(lossPct: 10, rttMs: 900, now: .seconds(2))
        let down = try changed(controller.update(lossPct: 10, rttMs: 1_400, now: .seconds(3)))
        #expect(down.bitrateKbps == 12 && down.frameMs == 60 && down.fec)
    }

    @Test func aJitteryPathIsNotTakenForAQueue() {
        var controller = BitrateController()
        _ = controller.update(lossPct: 0, rttMs: 40, jitterMs: 30, now: .seconds(1))
        // Round trips spread 0–80 ms above the lowest by 45 ms of jitter: no queue, no decrease.
        for second in 2..<20 {
            _ = controller.update(lossPct: 0, rttMs: 40 + Double(second % 3) * 40, jitterMs: 45, now: .seconds(second))
        }
        #expect(controller.setting.bitrateKbps >= 32)
    }

    /// The benchmark's mid-call change: 15 % loss with delays spread over 0–80 ms each way. The
    /// round trips rise well above the lowest, but by the path's own spread, not by a queue.
    @Test func lossWithJitterIsNotTakenForCongestion() {
        var controller = BitrateController()
        _ = controller.update(lossPct: 0, rttMs: 42, jitterMs: 4, now: .seconds(1))
        for (second, rtt) in zip(2..<12, [120.0, 150, 95, 160, 130, 110, 155, 140, 100, 125]) {
            _ = controller.update(lossPct: 15, receivedLossPct: 15, rttMs: rtt, jitterMs: 18, now: .seconds(second))
        }
        #expect(controller.setting.bitrateKbps >= 32 && controller.setting.fec)
    }

    /// The same change as the call manager feeds it, through the monitor's 5 s window: FEC with a hint
    /// at the loss seen from the first bad report, no decrease while the new jitter spreads the round
    /// trips, and FEC off only once the window has seen the path good again.
    @Test func aPathTurningBadActsWithinAReportAndTurningGoodOnlyOnceTheWindowAgrees() throws {
        var monitor = QualityMonitor()
        var controller = BitrateController()
        var received = 0, lost = 0
        var settings: [(second: Int, setting: BitrateController.Setting)] = []
        for second in 0...30 {
            let bad = (10..<20).contains(second)
            received += bad ? 42 : 50
            lost += bad ? 8 : 0
            let rtt: Double = bad ? [120.0, 150, 95, 160, 130][second % 5] : 42
            let sample = MediaStatsSample(at: .seconds(second), roundTripTimeMs: rtt, jitterMs: bad ? 18 : 3,
                                          packetsReceived: received, packetsLost: lost, bytesReceived: 4_000 * second,
                                          remoteLossPct: bad ? 15 : 0, packetsSent: 50 * second)
            guard let report = monitor.add(sample), let setting = controller.update(report, now: sample.at) else { continue }
            settings.append((second, setting))
        }
        let firstBad = try #require(settings.first { $0.setting.fec })
        #expect(firstBad.second == 10 && firstBad.setting.expectedLossPct >= 15, "\(settings)")
        #expect(settings.allSatisfy { $0.setting.bitrateKbps >= 32 }, "\(settings)")
        let off = try #require(settings.first { $0.second >= 20 && !$0.setting.fec })
        #expect(off.second > 20, "FEC stays on until the window no longer holds the loss: \(settings)")
    }

    /// Jitter throws single round trips well above the mean; the queue is judged by the mean.
    @Test func singleRoundTripsThrownHighByJitterAreNotAQueue() {
        var controller = BitrateController()
        _ = controller.update(lossPct: 0, rttMs: 42, jitterMs: 4, now: .seconds(1))
        // 0–80 ms of jitter each way reads as about 20 ms; two round trips in a row 150 ms above the lowest.
        for (second, rtt) in zip(2..<8, [192.0, 190, 110, 95, 180, 185]) {
            _ = controller.update(lossPct: 15, receivedLossPct: 15, rttMs: rtt, jitterMs: 20, meanRttMs: 125, now: .seconds(second))
        }
        #expect(controller.setting.bitrateKbps == 48, "FEC's bits, and no decrease")
        // A queue raises the mean too: then the rate comes down.
        for second in 8..<12 {
            _ = controller.update(lossPct: 15, receivedLossPct: 15, rttMs: 260, jitterMs: 20, meanRttMs: 240, now: .seconds(second))
        }
        #expect(controller.setting.bitrateKbps < 48)
    }

    /// A path that spreads its round trips with jitter but loses nothing and does not queue gets
    /// the bitrate a clean one gets (it stayed at 32 kbit/s while round trips read over 150 ms).
    @Test func aJitteryPathThatDoesNotQueueIsRaisedLikeACleanOne() {
        var controller = BitrateController()
        // 0–80 ms of jitter each way on a 40 ms path, read as about 22 ms of jitter: round trips of
        // 110–280 ms, none lower than 150 after the first (as a call in the quality benchmark read).
        _ = controller.update(lossPct: 0, rttMs: 110, jitterMs: 20, now: .seconds(1))
        let rtts: [Double] = [180, 150, 200, 170, 160, 190]
        for second in 2..<40 {
            _ = controller.update(lossPct: 0, rttMs: rtts[second % rtts.count], jitterMs: 22, meanRttMs: 175, now: .seconds(second))
        }
        #expect(controller.setting.bitrateKbps > 50, "\(controller.setting)")
        // Round trips past 300 ms are not raised on: the lowest may have crossed a queue too.
        var long = BitrateController()
        for second in 1..<40 { _ = long.update(lossPct: 0, rttMs: 320, jitterMs: 2, now: .seconds(second)) }
        #expect(long.setting.bitrateKbps == 32)
    }

    @Test func aFillingQueueLowersTheBitrateBeforeAnyLoss() throws {
        var controller = BitrateController()
        _ = controller.update(lossPct: 0, rttMs: 40, now: .seconds(1))
        #expect(controller.update(lossPct: 0, rttMs: 130, now: .seconds(2)) == nil)
        let down = try changed(controller.update(lossPct: 0, rttMs: 135, now: .seconds(3)))
        #expect(down.bitrateKbps == 24 && !down.fec)
    }

    @Test func noIncreaseOnARoundTripNeverMeasuredAndNoneForLongLowersTheBitrate() throws {
        var controller = BitrateController()
        for second in 0..<5 {
            #expect(controller.update(lossPct: 0, rttMs: nil, now: .seconds(second)) == nil)
        }
        // Five seconds without one receiver report getting through: the path is choked.
        #expect(controller.update(lossPct: 0, rttMs: nil, now: .seconds(5)) == nil, "confirmed first")
        let down = try changed(controller.update(lossPct: 0, rttMs: nil, now: .seconds(6)))
        #expect(down.bitrateKbps == 24)
    }

    /// As a 32 kbit/s bottleneck with a 1.5 s queue does it: the first report to get through comes
    /// with a 1.9 s round trip, and it is the lowest the call will see.
    @Test func aFirstRoundTripThroughAFullQueueIsNotTakenForThePath() throws {
        var controller = BitrateController()
        var settings: [BitrateController.Setting] = []
        for second in 1...3 {
            if let s = controller.update(lossPct: 6, receivedLossPct: 6, rttMs: nil, now: .seconds(second)) { settings.append(s) }
        }
        for second in 4...8 {
            if let s = controller.update(lossPct: 25, receivedLossPct: 30, rttMs: 1_929, now: .seconds(second)) { settings.append(s) }
        }
        #expect(settings.allSatisfy { $0.bitrateKbps <= 32 }, "no boost for FEC on a queued path: \(settings)")
        #expect(controller.setting.bitrateKbps == 12 && controller.setting.fec, "\(settings)")
        // The queue drained, loss lingers: no jump back to 48 kbit/s that would fill it again.
        for second in 9...30 { _ = controller.update(lossPct: 5, rttMs: 60, now: .seconds(second)) }
        #expect(controller.setting.bitrateKbps == 12)
        // A long path of its own with loss but no queue is not lowered, nor boosted past 250 ms.
        var far = BitrateController()
        for second in 1...10 { _ = far.update(lossPct: 5, rttMs: 600, now: .seconds(second)) }
        #expect(far.setting.bitrateKbps == 32 && far.setting.fec)
    }

    @Test func bitrateStaysWithinItsBounds() {
        var configuration = BitrateController.Configuration()
        configuration.confirmations = 1
        configuration.increaseHoldOff = .zero
        configuration.decreaseHoldOff = .zero
        var controller = BitrateController(configuration: configuration)
        for second in 0..<40 { _ = controller.update(lossPct: 0, rttMs: 10, now: .seconds(second)) }
        #expect(controller.setting.bitrateKbps == 64)
        for second in 40..<80 { _ = controller.update(lossPct: 30, rttMs: 200, now: .seconds(second)) }
        #expect(controller.setting.bitrateKbps == 12)
    }
}
