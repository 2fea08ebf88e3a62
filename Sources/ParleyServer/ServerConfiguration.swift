/// Everything a signaling server can be told. The defaults serve a developer's machine: loopback,
/// development mode, protocol v1's default limits.
public struct ServerConfiguration: Sendable {
    public var host: String = "127.0.0.1"
    /// 0 picks a free port (tests).
    public var port: Int = 8080
    /// The SQLite file; `nil` keeps everything in memory.
    public var databasePath: String? = "parley.sqlite"
    /// Development mode serves `POST /v1/dev/tokens`.
    public var developmentMode: Bool = true
    public var tokenKey: TokenKey = .hs256(secret: "parley-development-secret-not-for-production")
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
    public var limits = Limits()

    public struct Limits: Sendable {
        /// Bigger frames close the connection with 1009.
        public var maxFrameSize: Int = 64 * 1024
        /// Sustained frames per second per connection.
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

        public init() {}
    }

    public init() {}
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

    public init(url: String, clientURL: String? = nil) {
        self.url = url
        self.clientURL = clientURL ?? url
    }
}
