import ParleyAPNs
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
    let callsRestored: Counter
    let slowConnections: Counter
    /// Pushes by type (voip, alert) and outcome (delivered, token_invalid, failed).
    private let pushes: [String: Counter]
    let pushTokensRemoved: Counter
    private let apnsDuration: DurationHistogram
    private let apnsResponses: [String: Counter]
    /// Messages this node sent the others, by kind (`NodeMessage.kind`).
    private let nodeMessages: [String: Counter]

    static let knownOutcomes: [EndReason] = [
        .hangup, .cancelled, .declined, .busy, .noAnswer, .connectionLost,
    ]

    public init(registry: PrometheusCollectorRegistry = PrometheusCollectorRegistry()) {
        self.registry = registry
        // Counters carry the unit `total`; gauges have none.
        func name(_ metric: String, unit: String = "", _ help: String) -> MetricNameDescriptor {
            MetricNameDescriptor(namespace: "parley", metricName: metric, unitName: unit, helpText: help)
        }
        let callsByState = name("calls", "Calls by state")
        let errorsByCode = name("errors", unit: "total", "Error frames sent, by code")
        let endedByOutcome = name("calls_ended", unit: "total", "Calls ended, by outcome")
        connections = registry.makeGauge(descriptor: name("connections", "Open WebSocket connections"))
        sessions = registry.makeGauge(descriptor: name("sessions", "Signaling sessions, live or held for resume"))
        ringingCalls = registry.makeGauge(descriptor: callsByState, labels: [("state", "ringing")])
        activeCalls = registry.makeGauge(descriptor: callsByState, labels: [("state", "active")])
        framesIn = registry.makeCounter(descriptor: name("frames_in", unit: "total", "Frames received from clients"))
        framesOut = registry.makeCounter(descriptor: name("frames_out", unit: "total", "Frames sent to clients"))
        var errors: [ErrorCode: Counter] = [:]
        for code in ErrorCode.all {
            errors[code] = registry.makeCounter(descriptor: errorsByCode, labels: [("code", code.rawValue)])
        }
        self.errors = errors
        otherErrors = registry.makeCounter(descriptor: errorsByCode, labels: [("code", "other")])
        var outcomes: [EndReason: Counter] = [:]
        for reason in Self.knownOutcomes {
            outcomes[reason] = registry.makeCounter(descriptor: endedByOutcome, labels: [("outcome", reason.rawValue)])
        }
        self.outcomes = outcomes
        otherOutcomes = registry.makeCounter(descriptor: endedByOutcome, labels: [("outcome", "other")])
        callsStarted = registry.makeCounter(descriptor: name("calls_started", unit: "total", "Calls invited"))
        callsRestored = registry.makeCounter(descriptor: name("calls_restored", unit: "total",
                                                              "Unfinished calls taken over from the store at start"))
        slowConnections = registry.makeCounter(descriptor: name("slow_connections_closed", unit: "total",
                                                                "Connections closed for falling behind their outbound buffer"))
        let pushesByOutcome = name("pushes", unit: "total", "Pushes sent, by type and outcome")
        var pushes: [String: Counter] = [:]
        for type in ["voip", "alert"] {
            for outcome in ["delivered", "token_invalid", "failed"] {
                pushes["\(type) \(outcome)"] = registry.makeCounter(descriptor: pushesByOutcome, labels: [("type", type), ("outcome", outcome)])
            }
        }
        self.pushes = pushes
        pushTokensRemoved = registry.makeCounter(descriptor: name("push_tokens_removed", unit: "total",
                                                                  "VoIP tokens forgotten because APNs rejected them"))
        apnsDuration = registry.makeDurationHistogram(
            descriptor: name("apns_request_duration", unit: "seconds", "APNs requests, from sending to the answer"),
            buckets: [.milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500),
                      .seconds(1), .seconds(2.5), .seconds(5), .seconds(10)]
        )
        let responsesByStatus = name("apns_responses", unit: "total", "APNs answers, by status (none: no answer came)")
        var responses: [String: Counter] = [:]
        for status in Self.apnsStatuses {
            responses[status] = registry.makeCounter(descriptor: responsesByStatus, labels: [("status", status)])
        }
        apnsResponses = responses
        let nodeMessagesByKind = name("node_messages_sent", unit: "total", "Messages sent to other nodes, by kind")
        nodeMessages = Dictionary(uniqueKeysWithValues: NodeMessage.kinds.map { kind in
            (kind, registry.makeCounter(descriptor: nodeMessagesByKind, labels: [("kind", kind)]))
        })
    }

    static let apnsStatuses = ["200", "400", "403", "405", "410", "413", "429", "500", "503", "other", "none"]

    func pushed(_ push: Push, _ outcome: PushOutcome) {
        let name = switch outcome {
        case .delivered: "delivered"
        case .tokenInvalid: "token_invalid"
        case .failed: "failed"
        }
        pushes["\(push.pushType) \(name)"]?.increment()
    }

    func apnsRequest(_ exchange: APNsExchange) {
        apnsDuration.record(exchange.duration)
        let status = exchange.status.map(String.init) ?? "none"
        (apnsResponses[status] ?? apnsResponses["other"])?.increment()
    }

    func sentToNode(_ message: NodeMessage) { nodeMessages[message.kind]?.increment() }

    func error(_ code: ErrorCode) { (errors[code] ?? otherErrors).increment() }
    func callEnded(_ reason: EndReason) { (outcomes[reason] ?? otherOutcomes).increment() }

    /// The Prometheus text exposition of every metric.
    public func exposition() -> String {
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return String(decoding: buffer, as: UTF8.self)
    }
}
