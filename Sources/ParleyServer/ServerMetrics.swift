import ParleyProtocol
import Prometheus

/// The server's Prometheus metrics, served at `/metrics`.
public struct ServerMetrics: Sendable {
    public let registry: PrometheusCollectorRegistry
    let connections: Gauge
    let sessions: Gauge
    let ringingCalls: Gauge
    let activeCalls: Gauge
    let framesIn: Counter
    let framesOut: Counter
    private let errors: [ErrorCode: Counter]
    private let otherErrors: Counter
    private let outcomes: [EndReason: Counter]
    private let otherOutcomes: Counter
    let callsStarted: Counter

    static let knownOutcomes: [EndReason] = [
        .hangup, .cancelled, .declined, .busy, .noAnswer, .connectionLost, .serverShutdown,
    ]

    public init(registry: PrometheusCollectorRegistry = PrometheusCollectorRegistry()) {
        self.registry = registry
        connections = registry.makeGauge(name: "parley_connections", help: "Open WebSocket connections")
        sessions = registry.makeGauge(name: "parley_sessions", help: "Signaling sessions, live or held for resume")
        ringingCalls = registry.makeGauge(name: "parley_calls", labels: [("state", "ringing")], help: "Calls by state")
        activeCalls = registry.makeGauge(name: "parley_calls", labels: [("state", "active")], help: "Calls by state")
        framesIn = registry.makeCounter(name: "parley_frames_in_total", help: "Frames received from clients")
        framesOut = registry.makeCounter(name: "parley_frames_out_total", help: "Frames sent to clients")
        var errors: [ErrorCode: Counter] = [:]
        for code in ErrorCode.all {
            errors[code] = registry.makeCounter(name: "parley_errors_total", labels: [("code", code.rawValue)], help: "Error frames sent, by code")
        }
        self.errors = errors
        otherErrors = registry.makeCounter(name: "parley_errors_total", labels: [("code", "other")], help: "Error frames sent, by code")
        var outcomes: [EndReason: Counter] = [:]
        for reason in Self.knownOutcomes {
            outcomes[reason] = registry.makeCounter(name: "parley_calls_ended_total", labels: [("outcome", reason.rawValue)],
                                                    help: "Calls ended, by outcome")
        }
        self.outcomes = outcomes
        otherOutcomes = registry.makeCounter(name: "parley_calls_ended_total", labels: [("outcome", "other")],
                                             help: "Calls ended, by outcome")
        callsStarted = registry.makeCounter(name: "parley_calls_started_total", help: "Calls invited")
    }

    func error(_ code: ErrorCode) { (errors[code] ?? otherErrors).increment() }
    func callEnded(_ reason: EndReason) { (outcomes[reason] ?? otherOutcomes).increment() }

    /// The Prometheus text exposition of every metric.
    public func exposition() -> String {
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return String(decoding: buffer, as: UTF8.self)
    }
}
