import Foundation
@testable import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import Testing

typealias NegotiationAction = NegotiationStateMachine.Action

private func offer(_ ufrag: String) -> SessionDescription { SessionDescription(type: "offer", sdp: "v=0\r\na=ice-ufrag:\(ufrag)\r\n") }
private func answer(_ ufrag: String) -> SessionDescription { SessionDescription(type: "answer", sdp: "v=0\r\na=ice-ufrag:\(ufrag)\r\n") }
private func candidate(_ name: String) -> IceCandidate { IceCandidate(candidate: "candidate:\(name) 1 udp 1 198.51.100.7 9 typ host", sdpMid: "0", sdpMLineIndex: 0) }
private func sending(_ description: SessionDescription) -> NegotiationAction { .send(SignalPayload(description: description)) }
private func sending(_ candidate: IceCandidate?) -> NegotiationAction { .send(SignalPayload(candidate: candidate.map(CandidateSignal.candidate) ?? .endOfCandidates)) }
private let restartRequest = NegotiationAction.send(SignalPayload(restartIce: true))
private func received(_ candidate: IceCandidate) -> SignalPayload { SignalPayload(candidate: .candidate(candidate)) }

@Suite("Negotiation state machine")
struct NegotiationStateMachineTests {
    /// The caller after its first round: stable, connected.
    static func connectedCaller(maxIceRestarts: Int = 3) -> NegotiationStateMachine {
        var caller = NegotiationStateMachine(polite: false, maxIceRestarts: maxIceRestarts)
        _ = caller.negotiationNeeded()
        _ = caller.offerCreated(offer("a1"))
        _ = caller.localDescriptionSet()
        _ = caller.received(SignalPayload(description: answer("b1")))
        _ = caller.remoteDescriptionSet()
        _ = caller.iceConnectionChanged(.connected)
        return caller
    }

    /// The callee after its first answer: stable, connected.
    static func connectedCallee(maxIceRestarts: Int = 3) -> NegotiationStateMachine {
        var callee = NegotiationStateMachine(polite: true, maxIceRestarts: maxIceRestarts)
        _ = callee.received(SignalPayload(description: offer("a1")))
        _ = callee.remoteDescriptionSet()
        _ = callee.answerCreated(answer("b1"))
        _ = callee.localDescriptionSet()
        _ = callee.iceConnectionChanged(.connected)
        return callee
    }

    /// Runs the caller's offer round from `createOffer` on, the far side answering with `b`.
    static func completeOffer(_ caller: inout NegotiationStateMachine, _ a: String, answeredWith b: String) -> [NegotiationAction] {
        #expect(caller.offerCreated(offer(a)) == [.setLocalDescription(offer(a))])
        #expect(caller.localDescriptionSet() == [sending(offer(a))])
        #expect(caller.received(SignalPayload(description: answer(b))) == [.setRemoteDescription(answer(b))])
        return caller.remoteDescriptionSet()
    }

    @Test func theCallerOffersAndSendsItsCandidatesAfterTheOffer() {
        var caller = NegotiationStateMachine(polite: false)
        #expect(caller.negotiationNeeded() == [.createOffer(iceRestart: false)])
        #expect(caller.offerCreated(offer("a1")) == [.setLocalDescription(offer("a1"))])
        // The engine gathers while the offer is applied: the candidates wait for the offer to leave.
        #expect(caller.localCandidate(candidate("1")) == [])
        #expect(caller.localDescriptionSet() == [sending(offer("a1")), sending(candidate("1"))])
        #expect(caller.localCandidate(nil) == [sending(nil)])
        #expect(caller.received(SignalPayload(description: answer("b1"))) == [.setRemoteDescription(answer("b1"))])
        #expect(caller.received(received(candidate("b"))) == [], "the answer is still being applied")
        #expect(caller.remoteDescriptionSet() == [.addRemoteCandidate(candidate("b"))])
        #expect(caller.received(SignalPayload(candidate: .endOfCandidates)) == [.addRemoteCandidate(nil)])
        #expect(caller.iceConnectionChanged(.checking) == [])
        #expect(caller.iceConnectionChanged(.connected) == [], "no media flows before DTLS-SRTP is up")
        #expect(caller.connectionChanged(.connecting) == [])
        #expect(caller.connectionChanged(.connected) == [.reportConnected])
    }

    /// A peer whose DTLS client shares no cipher suite with us (or whose certificate does not match
    /// its fingerprint) fails the handshake on a connected ICE pair: an ICE restart would not repeat
    /// the handshake, so negotiation ends, and the call never says "connected".
    @Test func aDTLSHandshakeThatFailsOnAConnectedPairEndsNegotiation() {
        var caller = Self.connectedCaller()
        #expect(caller.connectionChanged(.connecting) == [])
        #expect(caller.connectionChanged(.failed) == [.reportFailed(reason: "dtls-failed")])
        #expect(caller.connectionChanged(.connected) == [], "closed")
        #expect(caller.networkChanged() == [], "closed")
    }

    /// ICE failing takes the connection down with it: that is ICE's failure, and ICE restarts.
    @Test func aConnectionThatFailsWithICEIsRestartedNotEnded() {
        var caller = Self.connectedCaller()
        #expect(caller.iceConnectionChanged(.failed) == [.createOffer(iceRestart: true)])
        #expect(caller.connectionChanged(.failed) == [])
    }

    @Test func theCalleeAnswersAndNeverOffers() {
        var callee = NegotiationStateMachine(polite: true)
        #expect(callee.negotiationNeeded() == [], "its answer carries what it sends")
        #expect(callee.received(received(candidate("early"))) == [], "no remote description yet")
        #expect(callee.received(SignalPayload(description: offer("a1"))) == [.setRemoteDescription(offer("a1"))])
        #expect(callee.received(received(candidate("a"))) == [])
        #expect(callee.remoteDescriptionSet() == [.addRemoteCandidate(candidate("early")), .addRemoteCandidate(candidate("a")), .createAnswer])
        #expect(callee.answerCreated(answer("b1")) == [.setLocalDescription(answer("b1"))])
        #expect(callee.localCandidate(candidate("1")) == [])
        #expect(callee.localDescriptionSet() == [sending(answer("b1")), sending(candidate("1"))])
        #expect(callee.negotiationNeeded() == [], "not after its answer either")
        #expect(callee.received(SignalPayload(description: offer("a2"))) == [.setRemoteDescription(offer("a2"))], "later offers are answered")
    }

    @Test func aRestartWantedWhileTheOfferIsBeingCreatedRunsAfterIt() {
        var caller = NegotiationStateMachine(polite: false)
        #expect(caller.negotiationNeeded() == [.createOffer(iceRestart: false)])
        #expect(caller.networkChanged() == [], "an offer is being created")
        #expect(Self.completeOffer(&caller, "a1", answeredWith: "b1") == [.createOffer(iceRestart: true)])
        #expect(Self.completeOffer(&caller, "a2", answeredWith: "b2") == [], "one restart, not two")
        #expect(caller.iceRestarts == 1)
    }

    @Test func aNetworkChangeDuringARestartRestartsAgainAfterIt() {
        var caller = Self.connectedCaller()
        #expect(caller.networkChanged() == [.createOffer(iceRestart: true)])
        #expect(caller.offerCreated(offer("a2")) == [.setLocalDescription(offer("a2"))])
        // The offer was made on the old network: it cannot stand for the new one.
        #expect(caller.networkChanged() == [])
        #expect(caller.localDescriptionSet() == [sending(offer("a2"))])
        #expect(caller.received(SignalPayload(description: answer("b2"))) == [.setRemoteDescription(answer("b2"))])
        #expect(caller.remoteDescriptionSet() == [.createOffer(iceRestart: true)])
    }

    @Test func iceFailingDuringARestartIsLeftToThatRestart() {
        var caller = Self.connectedCaller()
        #expect(caller.iceConnectionChanged(.failed) == [.createOffer(iceRestart: true)])
        #expect(caller.iceConnectionChanged(.failed) == [])
        #expect(Self.completeOffer(&caller, "a2", answeredWith: "b2") == [])
        // Failing during an ordinary renegotiation is not covered by it.
        #expect(caller.negotiationNeeded() == [.createOffer(iceRestart: false)])
        #expect(caller.iceConnectionChanged(.failed) == [])
        #expect(Self.completeOffer(&caller, "a3", answeredWith: "b3") == [.createOffer(iceRestart: true)])
    }

    /// A connected call whose media stopped arriving restarts ICE (the path may be dead while
    /// ICE's keepalives have not yet given up on it); a restart in flight covers it.
    @Test func mediaThatStopsArrivingRestartsICE() {
        var caller = Self.connectedCaller()
        #expect(caller.mediaStopped() == [.createOffer(iceRestart: true)])
        #expect(caller.mediaStopped() == [], "the restart in flight covers it")
        #expect(Self.completeOffer(&caller, "a2", answeredWith: "b2") == [])
        #expect(caller.iceRestarts == 1)
        var callee = Self.connectedCallee()
        #expect(callee.mediaStopped() == [restartRequest], "the callee asks the caller to restart")
        var early = NegotiationStateMachine(polite: true)
        #expect(early.mediaStopped() == [], "before its first answer the callee has nothing to restart")
    }

    @Test func theCallerRestartsWhenTheCalleeAsks() {
        var caller = Self.connectedCaller()
        #expect(caller.received(SignalPayload(restartIce: true)) == [.createOffer(iceRestart: true)])
        // A request that arrives before the answer to our restart offer was sent before that answer:
        // the answer is made on the callee's new network, so the restart in flight covers it.
        #expect(caller.received(SignalPayload(restartIce: true)) == [])
        #expect(caller.offerCreated(offer("a2")) == [.setLocalDescription(offer("a2"))])
        #expect(caller.received(SignalPayload(restartIce: true)) == [])
        #expect(caller.localDescriptionSet() == [sending(offer("a2"))])
        #expect(caller.received(SignalPayload(restartIce: true)) == [])
        #expect(caller.received(SignalPayload(description: answer("b2"))) == [.setRemoteDescription(answer("b2"))])
        // Arriving after the answer, it was sent after it: another restart.
        #expect(caller.received(SignalPayload(restartIce: true)) == [])
        #expect(caller.remoteDescriptionSet() == [.createOffer(iceRestart: true)])
    }

    @Test func aRequestDuringAnOrdinaryOfferRestartsAfterIt() {
        var caller = Self.connectedCaller()
        #expect(caller.negotiationNeeded() == [.createOffer(iceRestart: false)])
        #expect(caller.received(SignalPayload(restartIce: true)) == [])
        #expect(Self.completeOffer(&caller, "a2", answeredWith: "b2") == [.createOffer(iceRestart: true)])
    }

    @Test func theCalleeAsksForARestartInsteadOfOffering() {
        var callee = Self.connectedCallee()
        #expect(callee.networkChanged() == [restartRequest])
        #expect(callee.iceConnectionChanged(.failed) == [restartRequest])
        #expect(callee.iceRestarts == 2)
        #expect(callee.received(SignalPayload(restartIce: true)) == [], "restarts are the caller's to make")
        #expect(callee.iceConnectionChanged(.connected) == [])
        #expect(callee.iceRestarts == 0)
        #expect(callee.connectionChanged(.connected) == [.reportConnected])
    }

    @Test func theCalleesWishesWaitForItsFirstOfferAndItsAnswers() {
        var callee = NegotiationStateMachine(polite: true)
        // Before the first offer, ICE has not started: the first answer gathers on the new network.
        #expect(callee.networkChanged() == [])
        #expect(callee.received(SignalPayload(description: offer("a1"))) == [.setRemoteDescription(offer("a1"))])
        #expect(callee.remoteDescriptionSet() == [.createAnswer])
        #expect(callee.answerCreated(answer("b1")) == [.setLocalDescription(answer("b1"))])
        // Mid-answer, the request waits for the answer (the caller then knows it came after it).
        #expect(callee.networkChanged() == [])
        #expect(callee.localDescriptionSet() == [sending(answer("b1")), restartRequest])
    }

    @Test func bothSidesRestartingAtOnceMakeOneRestart() {
        var caller = Self.connectedCaller()
        var callee = Self.connectedCallee()
        // Both networks change. The caller offers a restart, the callee asks for one.
        #expect(caller.networkChanged() == [.createOffer(iceRestart: true)])
        #expect(callee.networkChanged() == [restartRequest])
        // The request reaches the caller while its restart offer is out: covered.
        #expect(caller.received(SignalPayload(restartIce: true)) == [])
        #expect(caller.offerCreated(offer("a2")) == [.setLocalDescription(offer("a2"))])
        #expect(caller.localDescriptionSet() == [sending(offer("a2"))])
        #expect(callee.received(SignalPayload(description: offer("a2"))) == [.setRemoteDescription(offer("a2"))])
        #expect(callee.remoteDescriptionSet() == [.createAnswer])
        #expect(callee.answerCreated(answer("b2")) == [.setLocalDescription(answer("b2"))])
        #expect(callee.localDescriptionSet() == [sending(answer("b2"))])
        #expect(caller.received(SignalPayload(description: answer("b2"))) == [.setRemoteDescription(answer("b2"))])
        #expect(caller.remoteDescriptionSet() == [])
        #expect(caller.iceRestarts == 1 && callee.iceRestarts == 1)
    }

    @Test func anOfferArrivingWhileTheCallerOffersIsIgnored() {
        // A browser callee may still offer (perfect negotiation lets it, and it can roll back).
        var caller = Self.connectedCaller()
        #expect(caller.networkChanged() == [.createOffer(iceRestart: true)])
        #expect(caller.received(SignalPayload(description: offer("b2"))) == [], "being created")
        #expect(caller.offerCreated(offer("a2")) == [.setLocalDescription(offer("a2"))])
        #expect(caller.received(SignalPayload(description: offer("b2"))) == [], "being applied")
        #expect(caller.localDescriptionSet() == [sending(offer("a2"))])
        #expect(caller.received(SignalPayload(description: offer("b2"))) == [], "out")
        #expect(caller.received(received(candidate("of b2"))) == [.addRemoteCandidate(candidate("of b2"))], "refused by the engine, harmlessly")
        #expect(caller.received(SignalPayload(description: answer("b3"))) == [.setRemoteDescription(answer("b3"))])
        #expect(caller.remoteDescriptionSet() == [])
    }

    @Test func anOfferArrivingWhileTheAnswerIsAppliedIsTakenNext() {
        var caller = Self.connectedCaller()
        #expect(caller.negotiationNeeded() == [.createOffer(iceRestart: false)])
        #expect(caller.offerCreated(offer("a2")) == [.setLocalDescription(offer("a2"))])
        #expect(caller.localDescriptionSet() == [sending(offer("a2"))])
        #expect(caller.received(SignalPayload(description: answer("b2"))) == [.setRemoteDescription(answer("b2"))])
        // The far side answered, then offered: no collision, and its candidates follow its offer.
        #expect(caller.received(SignalPayload(description: offer("b3"))) == [])
        #expect(caller.received(received(candidate("of b3"))) == [])
        #expect(caller.remoteDescriptionSet() == [.setRemoteDescription(offer("b3"))])
        #expect(caller.remoteDescriptionSet() == [.addRemoteCandidate(candidate("of b3")), .createAnswer])
        #expect(caller.answerCreated(answer("a3")) == [.setLocalDescription(answer("a3"))])
        #expect(caller.localDescriptionSet() == [sending(answer("a3"))])
    }

    @Test func negotiationWantedMidRoundRunsAfterIt() {
        var caller = NegotiationStateMachine(polite: false)
        #expect(caller.negotiationNeeded() == [.createOffer(iceRestart: false)])
        #expect(caller.negotiationNeeded() == [])
        #expect(Self.completeOffer(&caller, "a1", answeredWith: "b1") == [.createOffer(iceRestart: false)])
    }

    @Test func restartsRunOutWithoutConnecting() {
        var caller = Self.connectedCaller(maxIceRestarts: 2)
        #expect(caller.iceConnectionChanged(.failed) == [.createOffer(iceRestart: true)])
        _ = Self.completeOffer(&caller, "a2", answeredWith: "b2")
        #expect(caller.iceConnectionChanged(.failed) == [.createOffer(iceRestart: true)])
        _ = Self.completeOffer(&caller, "a3", answeredWith: "b3")
        #expect(caller.iceConnectionChanged(.failed) == [.reportFailed(reason: "ice-failed")])
        #expect(caller.isClosed)
        #expect(caller.networkChanged() == [])
        #expect(caller.received(SignalPayload(description: offer("b4"))) == [])

        var callee = Self.connectedCallee(maxIceRestarts: 2)
        #expect(callee.iceConnectionChanged(.failed) == [restartRequest])
        #expect(callee.iceConnectionChanged(.failed) == [restartRequest])
        #expect(callee.iceConnectionChanged(.failed) == [.reportFailed(reason: "ice-failed")])
        #expect(callee.localCandidate(candidate("late")) == [])
    }

    @Test func aRestartWaitingForARoundThatRanOutFails() {
        var caller = Self.connectedCaller(maxIceRestarts: 1)
        #expect(caller.networkChanged() == [.createOffer(iceRestart: true)])
        #expect(caller.networkChanged() == [])
        #expect(Self.completeOffer(&caller, "a2", answeredWith: "b2") == [.reportFailed(reason: "ice-failed")])
    }

    @Test func aFailedStepEndsTheRoundAndWhatWaitedGoesAhead() {
        var caller = Self.connectedCaller()
        #expect(caller.negotiationNeeded() == [.createOffer(iceRestart: false)])
        #expect(caller.networkChanged() == [])
        #expect(caller.stepFailed() == [.createOffer(iceRestart: true)])
        #expect(caller.offerCreated(offer("a2")) == [.setLocalDescription(offer("a2"))])
        #expect(caller.localCandidate(candidate("2")) == [])
        #expect(caller.stepFailed() == [sending(candidate("2"))])
        #expect(caller.stepFailed() == [], "nothing in flight")

        var callee = Self.connectedCallee()
        #expect(callee.received(SignalPayload(description: offer("a2"))) == [.setRemoteDescription(offer("a2"))])
        #expect(callee.networkChanged() == [])
        #expect(callee.stepFailed() == [restartRequest])
    }

    @Test func aClosedMachineDoesNothing() {
        var caller = Self.connectedCaller()
        _ = caller.close()
        #expect(caller.negotiationNeeded() == [])
        #expect(caller.localCandidate(candidate("1")) == [])
        #expect(caller.iceConnectionChanged(.connected) == [])
        #expect(caller.connectionChanged(.connected) == [])
        #expect(caller.connectionChanged(.failed) == [])
        #expect(caller.received(SignalPayload(description: offer("b2"), candidate: .endOfCandidates, restartIce: true)) == [])
        #expect(caller.offerCreated(offer("a2")) == [])
        #expect(caller.remoteDescriptionSet() == [])
    }
}

/// Two state machines, two models of webrtcbin's signaling states and a FIFO signaling path each
/// way, run through every order in which their steps can happen: performing the next action,
/// delivering the next signal, delivering the engine's next candidate, and the scenario's events
/// (a network change, ICE failing) at any moment. Every run must end with both engines stable on
/// the same ICE credentials, no operation refused by an engine (a rollback would be one), no
/// candidate applied to a description older than its own, and fresh ICE credentials on both sides
/// after every network change and ICE failure.
@Suite("Negotiation: every interleaving")
struct NegotiationInterleavingTests {
    enum Trigger: Hashable, CustomStringConvertible {
        case networkChanged, iceFailed
        var description: String { self == .networkChanged ? "network changed" : "ICE failed" }
    }

    /// webrtcbin as far as negotiation goes: signaling states, and ICE credentials by generation.
    struct Engine: Hashable {
        let name: String
        var state = PeerSignalingState.stable
        var localGeneration: Int?
        var remoteGeneration: Int?
        var generations = 0
        var answerRestarts = false
        /// Candidates gathered but not yet delivered to the negotiator (`PeerConnection.events`).
        var events: [IceCandidate?] = []

        mutating func fresh() -> Int { generations += 1; return generations }
    }

    /// What a trigger needs before the run may end. A network change: a round with fresh credentials
    /// on both sides whose own part was made after it. ICE failing: a round with fresh credentials
    /// on both sides that ends after it (one already under way will do).
    enum Wish: Hashable { case none, pending, offered(generation: Int), answered(generation: Int), anyRestartRound, satisfied }

    struct Side: Hashable {
        var machine: NegotiationStateMachine
        var engine: Engine
        var queue: [NegotiationAction] = []
        var inbox: [SignalPayload] = []
        var triggers: [Trigger]
        var wish = Wish.none
    }

    struct World: Hashable {
        var caller: Side
        var callee: Side
        var failure: String?
        /// The generations of the last completed round: the caller's offer, the callee's answer.
        var lastRound: [Int] = []

        subscript(_ isCaller: Bool) -> Side {
            get { isCaller ? caller : callee }
            set { if isCaller { caller = newValue } else { callee = newValue } }
        }
    }

    static func description(_ name: String, _ type: String, _ generation: Int) -> SessionDescription {
        SessionDescription(type: type, sdp: "\(name)\(generation)")
    }

    static func generation(_ description: SessionDescription) -> Int { Int(description.sdp.dropFirst())! }
    static func generation(_ candidate: IceCandidate) -> Int { Int(candidate.candidate.split(separator: " ")[1])! }

    /// One step of one side; described (from the world it was taken in) only for a failure report.
    struct Step: Hashable {
        enum Kind: Hashable { case perform, receive, gather, trigger }
        var kind: Kind
        var byCaller: Bool

        func describe(in world: World) -> String {
            let side = world[byCaller]
            let who = byCaller ? "caller" : "callee"
            switch kind {
            case .perform: return "\(who) performs \(side.queue[0])"
            case .receive: return "\(who) receives \(side.inbox[0])"
            case .gather: return "\(who)'s engine gathers \(side.engine.events[0].map(\.candidate) ?? "end")"
            case .trigger: return "\(who): \(side.triggers[0])"
            }
        }
    }

    /// Every step that can happen next.
    static func steps(_ world: World) -> [(Step, World)] {
        var next: [(Step, World)] = []
        for isCaller in [true, false] {
            let side = world[isCaller]
            if let action = side.queue.first {
                var w = world
                w[isCaller].queue.removeFirst()
                perform(action, by: isCaller, in: &w)
                next.append((Step(kind: .perform, byCaller: isCaller), w))
            }
            if let signal = side.inbox.first {
                var w = world
                w[isCaller].inbox.removeFirst()
                w[isCaller].queue += w[isCaller].machine.received(signal)
                next.append((Step(kind: .receive, byCaller: isCaller), w))
            }
            if let candidate = side.engine.events.first {
                var w = world
                w[isCaller].engine.events.removeFirst()
                w[isCaller].queue += w[isCaller].machine.localCandidate(candidate)
                next.append((Step(kind: .gather, byCaller: isCaller), w))
            }
            // ICE can fail only once it has started.
            if let trigger = side.triggers.first, trigger == .networkChanged || side.engine.remoteGeneration != nil {
                var w = world
                w[isCaller].triggers.removeFirst()
                w[isCaller].wish = trigger == .networkChanged ? .pending : .anyRestartRound
                w[isCaller].queue += trigger == .networkChanged ? w[isCaller].machine.networkChanged() : w[isCaller].machine.iceConnectionChanged(.failed)
                next.append((Step(kind: .trigger, byCaller: isCaller), w))
            }
        }
        return next
    }

    static func perform(_ action: NegotiationAction, by isCaller: Bool, in world: inout World) {
        var side = world[isCaller]
        var engine = side.engine
        func refuse(_ what: String) {
            world.failure = "\(engine.name) refused \(what) in \(engine.state.rawValue)"
        }
        var results: [NegotiationAction] = []
        switch action {
        case .createOffer(let iceRestart):
            let generation = iceRestart || engine.localGeneration == nil ? engine.fresh() : engine.localGeneration!
            if side.wish == .pending, generation != engine.localGeneration { side.wish = .offered(generation: generation) }
            results = side.machine.offerCreated(description(engine.name, "offer", generation))
        case .createAnswer:
            guard engine.state == .haveRemoteOffer else { return refuse("createAnswer") }
            let generation = engine.answerRestarts || engine.localGeneration == nil ? engine.fresh() : engine.localGeneration!
            if side.wish == .pending, generation != engine.localGeneration { side.wish = .answered(generation: generation) }
            results = side.machine.answerCreated(description(engine.name, "answer", generation))
        case .setLocalDescription(let local):
            switch (local.type, engine.state) {
            case ("offer", .stable): engine.state = .haveLocalOffer
            case ("answer", .haveRemoteOffer): engine.state = .stable
            default: return refuse("setLocalDescription(\(local.type))")
            }
            if Self.generation(local) != engine.localGeneration {
                engine.events.append(IceCandidate(candidate: "\(engine.name) \(Self.generation(local))"))
            }
            engine.localGeneration = Self.generation(local)
            engine.answerRestarts = false
            results = side.machine.localDescriptionSet()
        case .setRemoteDescription(let remote):
            switch (remote.type, engine.state) {
            case ("offer", .stable): engine.state = .haveRemoteOffer
            case ("answer", .haveLocalOffer): engine.state = .stable
            default: return refuse("setRemoteDescription(\(remote.type)) (it would need a rollback)")
            }
            if remote.type == "offer", let previous = engine.remoteGeneration, previous != Self.generation(remote) { engine.answerRestarts = true }
            engine.remoteGeneration = Self.generation(remote)
            if remote.type == "answer", let offered = engine.localGeneration, let answered = engine.remoteGeneration {
                // A round is complete: the wishes it meets are met.
                let restarted = world.lastRound.isEmpty || (world.lastRound[0] != offered && world.lastRound[1] != answered)
                world.lastRound = [offered, answered]
                for isWisher in [true, false] {
                    switch world[isWisher].wish {
                    case .offered(let g) where isWisher == isCaller && g == offered,
                         .answered(let g) where isWisher != isCaller && g == answered:
                        setWish(.satisfied, isWisher, isCaller, &side, &world)
                    case .anyRestartRound where restarted:
                        setWish(.satisfied, isWisher, isCaller, &side, &world)
                    default:
                        break
                    }
                }
            }
            results = side.machine.remoteDescriptionSet()
        case .addRemoteCandidate(let candidate):
            guard let remote = engine.remoteGeneration else { return refuse("a candidate before any remote description") }
            if let candidate, Self.generation(candidate) > remote {
                world.failure = "\(engine.name) got a candidate of generation \(Self.generation(candidate)) before its description (it has \(remote))"
                return
            }
        case .send(let signal):
            world[!isCaller].inbox.append(signal)
        case .reportConnected:
            break
        case .reportFailed(let reason):
            world.failure = "\(engine.name) gave up: \(reason)"
            return
        }
        side.engine = engine
        side.queue += results
        world[isCaller] = side
    }

    /// Marks a wish; `side` is the performer's copy, written back after the step.
    static func setWish(_ wish: Wish, _ isWisher: Bool, _ isPerformer: Bool, _ side: inout Side, _ world: inout World) {
        if isWisher == isPerformer { side.wish = wish } else { world[isWisher].wish = wish }
    }

    static func finalFailure(_ world: World) -> String? {
        let caller = world.caller.engine, callee = world.callee.engine
        if caller.state != .stable || callee.state != .stable { return "ended in \(caller.state.rawValue) / \(callee.state.rawValue)" }
        if caller.localGeneration != callee.remoteGeneration || callee.localGeneration != caller.remoteGeneration {
            return "the two sides disagree on ICE credentials"
        }
        for (name, side) in [("caller", world.caller), ("callee", world.callee)] where side.wish != .none && side.wish != .satisfied {
            return "the \(name)'s restart was lost (\(side.wish))"
        }
        return nil
    }

    /// Explores every order; answers the first failing one, or how many states were reached.
    static func explore(caller callerTriggers: [Trigger], callee calleeTriggers: [Trigger], connected: Bool) -> (states: Int, failure: String?) {
        var caller = Side(machine: NegotiationStateMachine(polite: false, maxIceRestarts: 10), engine: Engine(name: "a"), triggers: callerTriggers)
        let callee = Side(machine: NegotiationStateMachine(polite: true, maxIceRestarts: 10), engine: Engine(name: "b"), triggers: calleeTriggers)
        caller.queue = caller.machine.negotiationNeeded()
        var start = World(caller: caller, callee: callee)
        if connected {
            // Run the first round to its end before anything happens.
            var triggers = (start.caller.triggers, start.callee.triggers)
            (start.caller.triggers, start.callee.triggers) = ([], [])
            while let (_, next) = steps(start).first { start = next }
            (start.caller.triggers, start.callee.triggers) = triggers
            triggers = ([], [])
        }
        var seen: Set<World> = []
        var path: [Step] = []
        func search(_ world: World) -> String? {
            guard seen.insert(world).inserted else { return nil }
            if let failure = world.failure { return failure }
            let next = steps(world)
            if next.isEmpty { return finalFailure(world) }
            for (step, after) in next {
                path.append(step)
                if let failure = search(after) { return failure }
                path.removeLast()
            }
            return nil
        }
        guard let failure = search(start) else { return (seen.count, nil) }
        var world = start
        var story: [String] = []
        for step in path {
            story.append(step.describe(in: world))
            world = steps(world).first { $0.0 == step }!.1
        }
        return (seen.count, "\(failure) after:\n  " + story.joined(separator: "\n  "))
    }

    static let scenarios: [(caller: [Trigger], callee: [Trigger], connected: Bool)] = [
        ([.networkChanged], [.networkChanged], false),
        ([.networkChanged], [.networkChanged], true),
        ([.iceFailed], [.iceFailed], true),
        ([.networkChanged], [.iceFailed], true),
        ([.iceFailed], [.networkChanged], true),
        ([.networkChanged, .networkChanged], [.networkChanged], true),
        ([.networkChanged], [.networkChanged, .networkChanged], true),
    ]

    @Test(arguments: scenarios.indices)
    func everyOrderConverges(_ index: Int) {
        let scenario = Self.scenarios[index]
        let result = Self.explore(caller: scenario.caller, callee: scenario.callee, connected: scenario.connected)
        #expect(result.failure == nil, "caller \(scenario.caller), callee \(scenario.callee): \(result.failure ?? "")")
        #expect(result.states > 50, "the exploration went somewhere: \(result.states) states")
    }
}

@Suite("Negotiator over fake peer connections")
struct NegotiatorTests {
    /// The least a peer connection takes from the far side: a session with one media section.
    static let minimalSDP = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n"

    /// Two negotiators over fake peer connections (which refuse a rollback, as webrtcbin does),
    /// each one's signals carried to the other in order by a task of their own, as a signaling
    /// path carries them: a negotiator gets the far side's signal after it has sent its own.
    final class Pair: @unchecked Sendable {
        let callerPeer = FakePeerConnection(name: "caller")
        let calleePeer = FakePeerConnection(name: "callee")
        var caller: Negotiator!
        var callee: Negotiator!
        private let lock = NSLock()
        private var outcomes: [String: [Negotiator.Outcome]] = [:]
        private var runs: [Task<Void, Never>] = []
        private let toCaller = AsyncStream<SignalPayload>.makeStream()
        private let toCallee = AsyncStream<SignalPayload>.makeStream()
        private var holdingToCaller = false
        private var heldToCaller: [SignalPayload] = []

        init() {
            caller = Negotiator(peer: callerPeer, polite: false, logger: .init(label: "test"),
                                send: { [toCallee] signal in toCallee.continuation.yield(signal) },
                                report: { [unowned self] outcome in self.lock.withLock { self.outcomes["caller", default: []].append(outcome) } })
            callee = Negotiator(peer: calleePeer, polite: true, logger: .init(label: "test"),
                                send: { [toCaller] signal in toCaller.continuation.yield(signal) },
                                report: { [unowned self] outcome in self.lock.withLock { self.outcomes["callee", default: []].append(outcome) } })
            runs = [Task { await self.caller.run() }, Task { await self.callee.run() },
                    Task { for await signal in self.toCallee.stream { await self.callee.receive(signal) } },
                    Task {
                        for await signal in self.toCaller.stream {
                            let held = self.lock.withLock {
                                if self.holdingToCaller { self.heldToCaller.append(signal) }
                                return self.holdingToCaller
                            }
                            if !held { await self.caller.receive(signal) }
                        }
                    }]
        }

        /// Keeps the callee's signals from the caller until `releaseSignalsToCaller()`.
        func holdSignalsToCaller() { lock.withLock { holdingToCaller = true } }
        var signalsHeldForCaller: [SignalPayload] { lock.withLock { heldToCaller } }

        /// Hands the caller what was held, in order, on this task; then lets signals through again.
        func releaseSignalsToCaller() async {
            while let next: SignalPayload = lock.withLock({
                guard !heldToCaller.isEmpty else {
                    holdingToCaller = false
                    return nil
                }
                return heldToCaller.removeFirst()
            }) {
                await caller.receive(next)
            }
        }

        func connected(_ side: String) -> Bool { lock.withLock { outcomes[side]?.contains(.connected) == true } }
        func failed(_ side: String) -> Bool { lock.withLock { outcomes[side]?.contains(.failed(reason: "ice-failed")) == true } }

        func bothStable() async -> Bool {
            let caller = await callerPeer.signalingState()
            let callee = await calleePeer.signalingState()
            return caller == .stable && callee == .stable
        }

        func close() async {
            await callerPeer.close()
            await calleePeer.close()
            toCaller.continuation.finish()
            toCallee.continuation.finish()
            for run in runs { await run.value }
        }
    }

    @Test func theCallerOffersTheCalleeAnswersAndBothConnect() async throws {
        let pair = Pair()
        try await eventually { pair.connected("caller") && pair.connected("callee") }
        #expect(pair.callerPeer.offersMade == [false])
        #expect(pair.calleePeer.offersMade.isEmpty, "the callee makes no offer")
        #expect(pair.calleePeer.remote?.type == "offer")
        try await eventually { pair.calleePeer.candidates.count == 2 && pair.callerPeer.candidates.count == 2 }
        #expect(pair.calleePeer.candidates.last == .some(nil), "end of candidates arrives last")
        await pair.close()
    }

    @Test func bothSidesRestartingAtOnceConvergeWithoutARollback() async throws {
        let pair = Pair()
        try await eventually { pair.connected("caller") && pair.connected("callee") }
        // Both networks change at the same moment.
        async let a: Void = pair.caller.restartIce()
        async let b: Void = pair.callee.restartIce()
        _ = await (a, b)
        try await eventually("both stable, the callee on the caller's restart offer") {
            await pair.bothStable() && pair.calleePeer.remote?.sdp.contains("restart") == true
        }
        #expect(pair.calleePeer.offersMade.isEmpty, "offers never cross: only the caller makes them")
        #expect(pair.callerPeer.offersMade.first == false && pair.callerPeer.offersMade.dropFirst().allSatisfy { $0 })
        await pair.close()
    }

    /// ICE that fails on a restart's credentials as soon as they are applied (a network that stays
    /// down), reported before the answer's `setRemoteDescription` returns: the failure is the new
    /// credentials', so ICE restarts again, until the restarts run out. Handled before the answer's
    /// result, it would be taken for the old credentials' (which that round covers) and the call would
    /// hang on a dead network. The fake holds the answer's call until the failure has been read.
    @Test func aFailureReportedWhileARestartsAnswerIsAppliedIsTheNewCredentials() async throws {
        let pair = Pair()
        try await eventually { pair.connected("caller") && pair.connected("callee") }
        pair.callerPeer.pauseRemoteDescriptions()
        pair.holdSignalsToCaller()
        pair.callerPeer.breakNetwork()
        // The answer comes to a caller with nothing else to do, as from the signaling client: the
        // caller's event loop is free to read while the answer is applied.
        try await eventually("the callee answered the restart") { pair.signalsHeldForCaller.contains { $0.description?.type == "answer" } }
        try await eventually("the caller is idle, every event read") { await !pair.caller.isPerforming && pair.callerPeer.eventsUnread == 0 }
        let release = Task { await pair.releaseSignalsToCaller() }
        try await eventually("the caller applies the restart's answer") { pair.callerPeer.remoteDescriptionsWaiting == 1 }
        try await eventually("and has read ICE failing on it") { pair.callerPeer.eventsUnread == 0 }
        pair.callerPeer.resumeRemoteDescriptions()
        await release.value
        try await eventually("the caller restarts until the restarts run out") { pair.failed("caller") }
        #expect(pair.callerPeer.offersMade == [false, true, true, true])
        await pair.close()
    }

    @Test func theCallerRestartsWhenTheCalleeAsks() async throws {
        let pair = Pair()
        try await eventually { pair.connected("caller") && pair.connected("callee") }
        await pair.callee.restartIce()
        try await eventually("the caller made a restart offer, and it was answered") {
            await pair.bothStable() && pair.callerPeer.offersMade == [false, true]
        }
        #expect(pair.calleePeer.offersMade.isEmpty)
        #expect(pair.calleePeer.remote?.sdp.contains("restart") == true)
        await pair.close()
    }

    @Test func aRestartAskedForWhileTheOfferIsBeingMadeIsNotLost() async throws {
        let peer = FakePeerConnection(name: "caller")
        let sent = Locked<[SignalPayload]>([])
        let negotiator = Negotiator(peer: peer, polite: false, logger: .init(label: "test"),
                                    send: { signal in sent.set(sent.value + [signal]) }, report: { _ in })
        peer.pauseOfferCreation()
        let run = Task { await negotiator.run() }
        try await eventually("the first offer is being made") { peer.offersWaiting == 1 }
        await negotiator.restartIce()
        peer.resumeOfferCreation()
        try await eventually("the first offer went out") { sent.value.contains { $0.description?.type == "offer" } }
        await negotiator.receive(SignalPayload(description: SessionDescription(type: "answer", sdp: Self.minimalSDP)))
        try await eventually("then the restart") { peer.offersMade == [false, true] }
        await peer.close()
        await run.value
    }

    @Test func candidatesBeforeTheRemoteDescriptionWait() async throws {
        let peer = FakePeerConnection(name: "solo")
        let negotiator = Negotiator(peer: peer, polite: true, logger: .init(label: "test"), send: { _ in }, report: { _ in })
        let early = IceCandidate(candidate: "candidate:9 1 udp 1 198.51.100.7 9 typ host", sdpMid: "0", sdpMLineIndex: 0)
        await negotiator.receive(SignalPayload(candidate: .candidate(early)))
        #expect(peer.candidates.isEmpty)
        await negotiator.receive(SignalPayload(description: SessionDescription(type: "offer", sdp: Self.minimalSDP)))
        #expect(peer.candidates == [early])
        #expect(await peer.signalingState() == .stable, "answered")
    }
}

@Suite("ICE restarts through the real server")
struct ServerICERestartTests {
    @Test func bothNetworksChangingAtOnceConvergeAndTheCallGoesOn() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await CallFlowTests.connectedCall(server)
        let alicePeer = try #require(alice.peers.connections.first)
        let bobPeer = try #require(bob.peers.connections.first)
        async let a: Void = alice.manager.networkChanged()
        async let b: Void = bob.manager.networkChanged()
        _ = await (a, b)
        try await eventually("both sides stable on the caller's restart offer") {
            let aliceState = await alicePeer.signalingState()
            let bobState = await bobPeer.signalingState()
            return aliceState == .stable && bobState == .stable && bobPeer.remote?.sdp.contains("restart") == true
        }
        #expect(bobPeer.offersMade.isEmpty, "the callee made no offer to collide with the caller's")
        #expect(await alice.phase(call) == .connected)
        #expect(await bob.phase(call) == .connected)
        _ = bob.provider.perform { .end($0, call: call) }
        try await eventually("alice's call ends") { alice.provider.endReason(of: call) == .remoteEnded }
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    @Test func theCalleesRequestCrossesTheServerAndTheCallerRestarts() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await CallFlowTests.connectedCall(server)
        let alicePeer = try #require(alice.peers.connections.first)
        let bobPeer = try #require(bob.peers.connections.first)
        bobPeer.failIce()
        try await eventually("alice restarted ICE at bob's request") { alicePeer.offersMade == [false, true] }
        try await eventually("bob took the restart offer") { bobPeer.remote?.sdp.contains("restart") == true }
        #expect(bobPeer.offersMade.isEmpty)
        try await eventually("bob's ICE connected again") { bobPeer.currentIceState == .connected }
        _ = alice.provider.perform { .end($0, call: call) }
        try await eventually("bob's call ends") { bob.provider.endReason(of: call) == .remoteEnded }
        await alice.stop(); await bob.stop()
        try await server.stop()
    }
}
