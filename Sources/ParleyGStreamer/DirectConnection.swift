import Foundation

/// Two of the engine's peer connections wired straight to each other, with no signaling server:
/// `a` offers, `b` answers, candidates go across in memory. For self-checks (`parley doctor`) and tests.
public final class DirectConnection: Sendable {
    public let a: GStreamerPeerConnection
    public let b: GStreamerPeerConnection
    /// When the offer was made.
    public let started: ContinuousClock.Instant
    private let relay: Task<Void, Never>

    /// Negotiates and waits (up to `timeout`) until audio arrives both ways.
    public init(_ a: GStreamerPeerConnection, _ b: GStreamerPeerConnection, timeout: Duration = .seconds(10)) async throws {
        self.a = a
        self.b = b
        relay = Task {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { for await e in a.events { if case .localCandidate(let c?) = e { try? await b.addRemoteCandidate(c) } } }
                group.addTask { for await e in b.events { if case .localCandidate(let c?) = e { try? await a.addRemoteCandidate(c) } } }
            }
        }
        started = .now
        do {
            let offer = try await a.createOffer(iceRestart: false)
            try await a.setLocalDescription(offer)
            try await b.setRemoteDescription(offer)
            let answer = try await b.createAnswer()
            try await b.setLocalDescription(answer)
            try await a.setRemoteDescription(answer)
            let deadline = ContinuousClock.now + timeout
            while a.remoteAudioStartedAt == nil || b.remoteAudioStartedAt == nil || a.connectedAt == nil || b.connectedAt == nil {
                guard ContinuousClock.now < deadline else { throw MediaEngineError(.negotiation, "no audio both ways within \(timeout)") }
                try await Task.sleep(for: .milliseconds(5))
            }
        } catch {
            await close()
            throw error
        }
    }

    public func close() async {
        await a.close()
        await b.close()
        relay.cancel()
    }
}
