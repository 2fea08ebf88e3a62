import Foundation
import ParleyProtocol

/// Everything a signaling server can be told. The defaults serve a developer's machine: loopback,
/// development mode, protocol v1's default limits.
public struct ServerConfiguration: Sendable {
    public var host: String = "127.0.0.1"
    /// Browser pages (`Origin`) that may open signaling connections besides the server's own.
    /// Clients that send no `Origin` (native apps, the CLI) are not affected. In development mode
    /// on loopback, any loopback origin may connect too (local pages on other ports).
    public var allowedOrigins: [String] = []
    /// A bearer token for `GET /metrics`; without one, metrics are served on loopback only.
    public var metricsToken: String?
    /// Addresses of the reverse proxies (TLS terminators, load balancers) in front of the server:
    /// for a request from one of them the per-address limit counts the client its
    /// `X-Forwarded-For` names last, not the proxy. Empty: every request is its peer's.
    public var trustedProxies: [String] = []
    /// 0 picks a free port (tests).
    public var port: Int = 8080
    /// Where devices and calls are kept: a SQLite file's path, a PostgreSQL URL
    /// (`postgres://user@host/database`, see `PostgresLocation`), or `nil` for memory.
    public var databasePath: String? = "parley.sqlite"
    /// Development mode serves `POST /v1/dev/tokens`.
    public var developmentMode: Bool = true
    /// The default signs with a public constant: fine for a developer's loopback server, refused by
    /// `validate()` anywhere else.
    public var tokenKey: TokenKey = .hs256(secret: ServerConfiguration.developmentSecret)
    public static let developmentSecret = "parley-development-secret-not-for-production"
    /// The shortest HS256 secret a server off loopback accepts (RFC 7518 §3.2: at least the hash size).
    public static let minimumSecretBytes = 32
    /// A LAN listener's own server (`parley listen --lan`): callers on the network ask
    /// `POST /v1/lan/tokens` for a token, may call only the listener, and rooms are refused.
    public var lan: LANSettings?
    /// How long tokens minted by `POST /v1/dev/tokens` live.
    public var devTokenLifetime: Duration = .seconds(24 * 3600)
    public var iceServers = IceServerProvider()

    /// No accept within this time ends a call with `no-answer`.
    public var ringTimeout: Duration = .seconds(45)
    /// Seconds between client heartbeats, sent in `welcome`; silence for 3 × this closes with 4002.
    public var heartbeat: Int = 20
    /// The first frame must be `hello` within this time (else close 4001).
    public var helloTimeout: Duration = .seconds(10)
    /// How long a disconnected session is held for resume.
    public var resumeWindow: Duration = .seconds(60)
    /// How long an ended call stays in memory for `call.state` and `call.report` (at least 60 s).
    public var endedCallRetention: Duration = .seconds(120)
    /// Mesh rooms hold at most this many devices.
    public var meshRoomLimit: Int = 4
    /// With a Janus server, every room is an AudioBridge room.
    public var janus: JanusSettings?
    /// With APNs settings, pushes go to Apple's push service (else nowhere).
    public var apns: APNsSettings?
    /// How this node's messages reach the other nodes of a PostgreSQL deployment (`NodeBus`).
    public var nodeBus: NodeBus = .direct
    /// `host:port` at which the other nodes reach this one's listening socket for node links (not
    /// through a load balancer). Nil: `host` and the port listened on, when `host` names one
    /// address; a wildcard (`0.0.0.0`, `::`) names none, and the node's messages go by `NOTIFY`.
    public var nodeAddress: String?
    public var limits = Limits()

    public struct Limits: Sendable {
        /// Bigger frames close the connection with 1009.
        public var maxFrameSize: Int = 64 * 1024
        /// Sustained frames per second per connection (0: no limit).
        public var framesPerSecond: Double = 50
        /// Frames a connection may send at once above the sustained rate.
        public var burst: Double = 200
        /// More refused frames than this within `refusedWindow` close the connection with 4008.
        public var maxRefused: Int = 100
        public var refusedWindow: Duration = .seconds(2)
        /// Server frames kept for resume per session until the client acknowledges them.
        public var resumeBufferFrames: Int = 4096
        /// Answers remembered per session for idempotent request ids.
        public var rememberedRequests: Int = 1024
        /// Bytes of frames waiting to be written to one connection; a client that falls further
        /// behind is closed with 4010 and resumes (its frames wait in the session's resume buffer).
        public var outboundBufferBytes: Int = 4 << 20
        /// HTTP requests and WebSocket upgrades per remote address per second, sustained (0: no
        /// limit); more are answered 429 with `Retry-After`. `/healthz` is not counted.
        public var httpRequestsPerSecond: Double = 20
        /// Requests one address may make at once above the sustained rate: room for many devices
        /// behind one NAT reconnecting together.
        public var httpBurst: Double = 200
        /// Devices one user may register (`PUT /v1/devices`), and devices one user may have connected
        /// or resumable at once (a hello from one more is refused, and closed with 1008): each is rung,
        /// and pushed to, on every call, so one token must not hold thousands.
        public var devicesPerUser: Int = 32

        public init() {}
    }

    public init() {}

    /// Where the other nodes link to this one, listening on `port`: `nodeAddress`, or `host` and
    /// `port` when `host` names one address (not a wildcard).
    public func nodeLinkAddress(port: Int) -> String? {
        if let nodeAddress { return nodeAddress }
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        guard !["0.0.0.0", "::", ""].contains(bare) else { return nil }
        return bare.contains(":") ? "[\(bare)]:\(port)" : "\(bare):\(port)"
    }

    /// Whether `address` is a `host:port` other nodes can link to (an IPv6 host in brackets).
    public static func isNodeAddress(_ address: String) -> Bool { NodeLinks.url(address: address) != nil }

    /// Whether the server listens on loopback only.
    public var isLoopback: Bool { Self.isLoopback(host: host) }

    static func isLoopback(host: String) -> Bool {
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        return bare == "localhost" || bare == "::1" || bare.hasPrefix("127.")
    }

    /// Refuses what would be unsafe to serve: off loopback, tokens signed with the public development
    /// secret or a secret shorter than 32 bytes (anyone could mint tokens for any user).
    public func validate() throws(ConfigurationError) {
        if lan != nil, developmentMode {
            throw ConfigurationError("a LAN listener mints tokens only for callers with its PIN: development mode must be off")
        }
        if let pin = lan?.pin, pin.count < 4 || pin.utf8.count > 64 {
            throw ConfigurationError("a LAN PIN is 4 to 64 characters")
        }
        if let database = databasePath, PostgresLocation.isURL(database) {
            // A LAN listener's server is a node of its own; one on PostgreSQL would be a deployment's.
            if lan != nil { throw ConfigurationError("a LAN listener keeps its calls in memory or SQLite, not on PostgreSQL") }
            _ = try PostgresLocation(url: database)
        }
        if let nodeAddress, !Self.isNodeAddress(nodeAddress) {
            throw ConfigurationError("a node address is host:port (10.0.0.5:8080, [2001:db8::5]:8080), not '\(nodeAddress)'")
        }
        guard !isLoopback else { return }
        if case .hs256(let secret) = tokenKey {
            if secret == Self.developmentSecret {
                throw ConfigurationError("serving on \(host) (not loopback) needs a token secret of your own (--token-secret, PARLEY_TOKEN_SECRET)")
            }
            if secret.utf8.count < Self.minimumSecretBytes {
                throw ConfigurationError("the token secret must be at least \(Self.minimumSecretBytes) bytes when serving on \(host); it is \(secret.utf8.count)")
            }
        }
    }
}

/// The call part of protocol v1 served by a device on a local network, for callers that found it
/// with DNS-SD (docs/protocol.md, "Calls on a LAN").
public struct LANSettings: Sendable {
    /// The listening device's user: the only one callers may call, and a user id no caller may take.
    public var host: UserID
    /// The PIN a caller must give, when set.
    public var pin: String?
    /// Wrong PINs from one address before it must wait `lockout`.
    public var pinAttempts: Int = 5
    public var lockout: Duration = .seconds(60)
    /// How long a caller's token lives.
    public var tokenLifetime: Duration = .seconds(12 * 3600)

    public init(host: UserID, pin: String? = nil) {
        self.host = host
        self.pin = pin
    }
}

/// How the nodes of one deployment send each other messages (frames for devices, forwarded
/// requests and their answers). PostgreSQL stays their directory either way: who holds which device
/// and runs which call, and which nodes are live.
public enum NodeBus: String, Sendable, CaseIterable {
    /// A WebSocket from each node to each other it sends to (`/v1/cluster`), at the address the
    /// other published in the database; to a node that published none, or cannot be reached, `NOTIFY`.
    case direct
    /// PostgreSQL's `NOTIFY`, batched outside every transaction that writes rows.
    case postgres
}

/// A configuration the server refuses to run with, and why.
public struct ConfigurationError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Which browser pages may open a signaling connection: the server's own origin, the configured
/// ones, and in development mode on loopback any loopback page. Native clients send no `Origin`,
/// or a `ws:`/`wss:` one (swift-websocket sends `ws://host`), which no browser page ever sends.
struct OriginPolicy: Sendable {
    let allowed: Set<String>
    let anyLoopback: Bool

    init(configuration: ServerConfiguration) {
        allowed = Set(configuration.allowedOrigins.map(Self.normalised))
        anyLoopback = configuration.developmentMode && configuration.isLoopback
    }

    func allows(origin: String?, host: String?) -> Bool {
        guard let origin else { return true }
        let normalised = Self.normalised(origin)
        if allowed.contains(normalised) { return true }
        guard let url = URL(string: normalised), let originHost = url.host else { return false }
        if url.scheme == "ws" || url.scheme == "wss" { return true }
        let originAuthority = url.port.map { "\(originHost):\($0)" } ?? originHost
        if let host, originAuthority.lowercased() == host.lowercased() { return true }
        return anyLoopback && ServerConfiguration.isLoopback(host: originHost)
    }

    static func normalised(_ origin: String) -> String {
        origin.trimmingCharacters(in: .whitespaces).lowercased().trimmingCharacters(in: CharacterSet(charactersIn: "/"))
    }
}

/// Where the server finds Janus, and how it runs AudioBridge rooms there.
public struct JanusSettings: Sendable {
    /// The Janus WebSocket API as the server reaches it.
    public var url: String
    /// The same API as clients reach it (sent in `room.join` acks); the server's own by default.
    public var clientURL: String
    /// An empty room is destroyed this long after its last member left.
    public var emptyRoomGrace: Duration = .seconds(30)
    /// AudioBridge rooms hold at most this many devices.
    public var roomLimit: Int = 64
    /// Talking detection window in 20 ms packets (≤ 25: about half a second).
    public var audioActivePackets: Int = 25
    /// Level (0 loudest … 127 silence) above which a participant counts as talking.
    public var audioLevelAverage: Int = 40
    /// How long a Janus request may take.
    public var requestTimeout: Duration = .seconds(5)
    /// The key each room's Janus number and secret are derived from, the same on every node and
    /// after every restart: `SignalingServer` reads it from its store (`deploymentSecret`) and
    /// gives it to its hub only. Nil: a key of the process's own.
    var roomKey: [UInt8]?

    public init(url: String, clientURL: String? = nil) {
        self.url = url
        self.clientURL = clientURL ?? url
    }
}
