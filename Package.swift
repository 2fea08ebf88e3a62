// swift-tools-version:6.1
import PackageDescription

// Modules are split by what they depend on, so the heavy parts stay optional:
//   ParleyProtocol  the wire protocol v1: Codable messages, no networking
//   ParleyServer    the signaling server (Hummingbird, WebSocket, JWT, SQLite, metrics)
//   ParleyAPNs      an APNs provider: token (JWT) authentication, HTTP/2 over async-http-client, Apple's answers
//   ParleyAPNsTesting  an APNs double for tests: HTTP/2 over TLS that checks what APNs checks
//   ParleyServerTesting  the real server on an ephemeral port, for tests (never linked into `parley`)
//   ParleyLocalServices  Debian's Janus run privately on a veth pair, for the room benchmark and tests
//   ParleyKit       the client SDK core: signaling client, calls, negotiation, quality; no platform framework
//   ParleyNIOTransport  the SDK's WebSocket signaling transport on SwiftNIO (Linux, macOS)
//   ParleyWebSocket     the one text WebSocket client (swift-websocket) of the Janus client, the SDK's NIO transport and the bench
//   ParleyGStreamer the Linux media engine: the SDK's PeerConnection on GStreamer webrtcbin (C shim in CParleyGst)
//   ParleyAvahi     LAN discovery on Linux: DNS-SD through the Avahi daemon (C API in CAvahi)
//   ParleySoftphone a headless softphone on the SDK and the GStreamer engine (`parley call/listen/demo`)
//   ParleyJanus     a Janus client: sessions, handles, transactions, and the typed AudioBridge API
//   ParleyRooms     a device in an AudioBridge voice room, over any PeerConnectionFactory (Linux and iPhone)
//   ParleyTesting   in-memory transport and fakes of the SDK's ports, for apps' own tests
//   ParleyCLI       the `parley` command line, a thin layer over the libraries
//   ParleyWire      an impaired link between two network namespaces (TUN devices; C shim in CParleyNet),
//                   `parley-wire`, for the quality benchmark and the tests: this kernel has no netem
//   ParleyApple     the iPhone adapters: CallKit, PushKit, AVAudioSession, WebRTC, URLSession, Network
//                   (on Linux built against the stand-ins in Sources/AppleStandIns; docs/apple-stand-ins.md)
let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
]

// A program that runs the GStreamer engine exports two functions that wrap a library's own for the
// plugins GStreamer loads later, which bind to them only if the executable exports them: SSL_new,
// for the DTLS handshakes' retransmission timer (Sources/CParleyGst/parley_dtls_timer.c), and
// libnice's nice_agent_new_full, for ICE nomination (parley_ice_nomination.c). Set on executables
// and tests only, so the library products stay free of unsafe flags and usable as versioned
// dependencies; a program of yours that embeds ParleyGStreamer passes the same flags.
let exportsEngineWrappers: [LinkerSetting] = [
    .unsafeFlags(["SSL_new", "nice_agent_new_full"].flatMap { ["-Xlinker", "--export-dynamic-symbol=\($0)"] },
                 .when(platforms: [.linux])),
]

// The manifest is evaluated on the machine that builds: `#if os(Linux)` below asks where the build
// runs, not what it builds for (Xcode on a Mac evaluates it as macOS for an iPhone build too). What is
// declared here is declared on every host; what only a Linux host can build is in the block after it.
//
// On a Mac: `swift build` builds the server, the protocol, the SDK core, the Janus client and the
// `parley` command's server side (serve, token, push); ParleyApple builds for iOS (for macOS it is an
// empty module: CallKit's provider, AVAudioSession and VoIP pushes are iOS-only); the tests declared
// everywhere are the protocol's and the SDK core's. On Linux: everything, with Apple's frameworks
// replaced by the stand-ins in Sources/AppleStandIns (docs/apple-stand-ins.md).
#if os(Linux)
// Modules of the names of Apple's frameworks, holding the declarations ParleyApple uses, transcribed
// from the headers, so the adapters compile and are tested here. Nothing Apple-only is resolved on Linux.
let standInSettings = swiftSettings
let appleStandIns: [Target] = [
    .target(name: "StandInSupport", path: "Sources/AppleStandIns/StandInSupport", swiftSettings: standInSettings),
    .target(name: "AVFAudio", path: "Sources/AppleStandIns/AVFAudio", swiftSettings: standInSettings),
    .target(name: "CallKit", dependencies: ["AVFAudio", "StandInSupport"], path: "Sources/AppleStandIns/CallKit", swiftSettings: standInSettings),
    .target(name: "PushKit", dependencies: ["CallKit", "StandInSupport"], path: "Sources/AppleStandIns/PushKit", swiftSettings: standInSettings),
    // Not named `Network`: SwiftNIO and Hummingbird take `canImport(Network)` to mean an Apple platform.
    .target(name: "NetworkStandIn", dependencies: ["StandInSupport"], path: "Sources/AppleStandIns/NetworkStandIn", swiftSettings: standInSettings),
    .target(name: "CoreMedia", path: "Sources/AppleStandIns/CoreMedia", swiftSettings: standInSettings),
    .target(name: "AVFoundation", dependencies: ["AVFAudio", "CoreMedia"], path: "Sources/AppleStandIns/AVFoundation", swiftSettings: standInSettings),
    .target(name: "WebRTC", dependencies: ["AVFoundation", "StandInSupport"], path: "Sources/AppleStandIns/WebRTC", swiftSettings: standInSettings),
]
let appleFrameworks: [Target.Dependency] = ["AVFAudio", "AVFoundation", "CoreMedia", "CallKit", "PushKit", "NetworkStandIn", "WebRTC"]
let applePackages: [Package.Dependency] = []
// `parley`'s softphone commands (call, listen, lan, room, demo, doctor) and benchmarks run on Linux:
// the GStreamer engine, Avahi and /proc.
let cliOnLinux: (dependencies: [Target.Dependency], sources: [String]) = (["ParleyGStreamer", "ParleySoftphone", "ParleyAvahi"], [])
#else
let appleStandIns: [Target] = []
let appleFrameworks: [Target.Dependency] = [.product(name: "WebRTC", package: "WebRTC", condition: .when(platforms: [.iOS]))]
// Google's WebRTC as a binary package, pinned (iOS only).
let applePackages: [Package.Dependency] = [.package(url: "https://github.com/stasel/WebRTC.git", exact: "120.0.0")]
let cliOnLinux: (dependencies: [Target.Dependency], sources: [String]) = ([], [
    "Bench.swift", "BenchCalls.swift", "BenchNodes.swift", "BenchPage.swift", "BenchRelay.swift", "BenchRooms.swift", "Soak.swift",
    "Call.swift", "Demo.swift", "Doctor.swift", "EmbeddedServer.swift", "LAN.swift", "Listen.swift", "Room.swift", "SoftphoneConsole.swift",
])
#endif

let package = Package(
    name: "parley",
    platforms: [.macOS(.v14), .iOS(.v17)],
    products: [
        .library(name: "ParleyProtocol", targets: ["ParleyProtocol"]),
        .library(name: "ParleyServer", targets: ["ParleyServer"]),
        .library(name: "ParleyServerTesting", targets: ["ParleyServerTesting"]),
        .library(name: "ParleyAPNs", targets: ["ParleyAPNs"]),
        .library(name: "ParleyAPNsTesting", targets: ["ParleyAPNsTesting"]),
        .library(name: "ParleyKit", targets: ["ParleyKit"]),
        .library(name: "ParleyNIOTransport", targets: ["ParleyNIOTransport"]),
        .library(name: "ParleyJanus", targets: ["ParleyJanus"]),
        .library(name: "ParleyRooms", targets: ["ParleyRooms"]),
        .library(name: "ParleyTesting", targets: ["ParleyTesting"]),
        .library(name: "ParleyApple", targets: ["ParleyApple"]),
        .executable(name: "parley", targets: ["ParleyCLI"]),
    ],
    dependencies: [
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/hummingbird-project/hummingbird-auth.git", from: "2.5.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird-websocket.git", from: "2.8.1"),
        .package(url: "https://github.com/hummingbird-project/swift-websocket.git", from: "1.6.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.7.1"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio-http2.git", from: "1.46.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
    ] + applePackages,
    targets: [
        .target(
            name: "ParleyApple",
            dependencies: [
                "ParleyKit",
                "ParleyRooms",
                "ParleyJanus",
                "ParleyProtocol",
                .product(name: "Logging", package: "swift-log"),
            ] + appleFrameworks,
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyProtocol",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyAPNs",
            dependencies: [
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyAPNsTesting",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyServer",
            dependencies: [
                "ParleyProtocol",
                "ParleyJanus",
                "ParleyAPNs",
                "ParleyWebSocket",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdAuth", package: "hummingbird-auth"),
                .product(name: "HummingbirdWebSocket", package: "hummingbird-websocket"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            // The browser client: plain files, compiled into the server so `parley serve` needs nothing beside it.
            resources: [.embedInCode("Web")],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyLocalServices",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyServerTesting",
            dependencies: [
                "ParleyServer",
                "ParleyLocalServices",
                "ParleyProtocol",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyKit",
            dependencies: [
                "ParleyProtocol",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyWebSocket",
            dependencies: [
                .product(name: "WSClient", package: "swift-websocket"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyNIOTransport",
            dependencies: [
                "ParleyKit",
                "ParleyWebSocket",
                .product(name: "WSClient", package: "swift-websocket"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyRooms",
            dependencies: [
                "ParleyJanus",
                "ParleyKit",
                "ParleyProtocol",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyJanus",
            dependencies: [
                "ParleyProtocol",
                "ParleyWebSocket",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ParleyTesting",
            dependencies: ["ParleyKit", "ParleyProtocol"],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "ParleyCLI",
            dependencies: [
                "ParleyProtocol",
                "ParleyServer",
                "ParleyAPNs",
                "ParleyLocalServices",
                "ParleyKit",
                "ParleyNIOTransport",
                "ParleyWebSocket",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdWebSocket", package: "hummingbird-websocket"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ] + cliOnLinux.dependencies,
            exclude: cliOnLinux.sources,
            swiftSettings: swiftSettings,
            linkerSettings: exportsEngineWrappers
        ),
        .testTarget(
            name: "ParleyProtocolTests",
            dependencies: ["ParleyProtocol"],
            exclude: ["Golden"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ParleyKitTests",
            dependencies: [
                "ParleyKit",
                "ParleyNIOTransport",
                "ParleyTesting",
                "ParleyServerTesting",
                "ParleyLocalServices",
                "ParleyProtocol",
            ],
            swiftSettings: swiftSettings
        ),
    ]
)

#if os(Linux)
/// libFuzzer without its main (compiler-rt's libclang_rt.fuzzer_no_main), for parley-fuzz in the
/// AddressSanitizer build: scripts/asan-build.sh sets its path.
let libFuzzer = Context.environment["PARLEY_LIBFUZZER"].flatMap { $0.isEmpty ? nil : $0 }

// What only Linux builds: the GStreamer engine and the softphone, Avahi, the impaired wire (TUN), the
// fuzzers, and the tests that start Linux services (Janus, PostgreSQL, coturn, Chromium) or use the
// stand-ins. Tests run from a fresh Linux clone: scripts/test.sh.
package.products += [
    .library(name: "ParleyGStreamer", targets: ["ParleyGStreamer"]),
    .library(name: "ParleySoftphone", targets: ["ParleySoftphone"]),
    .library(name: "ParleyAvahi", targets: ["ParleyAvahi"]),
    .executable(name: "parley-wire", targets: ["ParleyWireCLI"]),
    .executable(name: "parley-fuzz", targets: ["ParleyFuzz"]),
]
package.targets += appleStandIns + [
    .testTarget(
        name: "ParleyAppleTests",
        dependencies: ["ParleyApple", "ParleyKit", "ParleyProtocol", "ParleyTesting", "ParleyNIOTransport", "ParleyServerTesting",
                       "ParleyLocalServices", .product(name: "Logging", package: "swift-log")] + appleFrameworks,
        swiftSettings: swiftSettings
    ),
    .systemLibrary(
        name: "CGStreamer",
        pkgConfig: "gstreamer-webrtc-1.0 gstreamer-sdp-1.0 gstreamer-rtp-1.0 gstreamer-1.0 nice",
        providers: [.apt(["libgstreamer1.0-dev", "libgstreamer-plugins-base1.0-dev", "libgstreamer-plugins-bad1.0-dev", "libnice-dev"])]
    ),
    .systemLibrary(
        name: "CAvahi",
        pkgConfig: "avahi-client",
        providers: [.apt(["libavahi-client-dev"])]
    ),
    .target(
        name: "ParleyAvahi",
        dependencies: ["CAvahi", "ParleyKit", "ParleyProtocol"],
        swiftSettings: swiftSettings
    ),
    .target(
        name: "CParleyGst",
        dependencies: ["CGStreamer"],
        linkerSettings: [.linkedLibrary("dl"), .linkedLibrary("crypto")]
    ),
    .target(
        name: "ParleyGStreamer",
        dependencies: [
            "CParleyGst",
            "ParleyKit",
            "ParleyProtocol",
            .product(name: "Logging", package: "swift-log"),
        ],
        swiftSettings: swiftSettings
    ),
    .target(
        name: "ParleySoftphone",
        dependencies: [
            "ParleyGStreamer",
            "ParleyJanus",
            "ParleyRooms",
            "ParleyKit",
            "ParleyNIOTransport",
            "ParleyProtocol",
            .product(name: "Logging", package: "swift-log"),
        ],
        swiftSettings: swiftSettings
    ),
    .target(name: "CParleyNet"),
    .target(
        name: "ParleyWire",
        dependencies: ["CParleyNet"],
        swiftSettings: swiftSettings
    ),
    .executableTarget(
        name: "ParleyWireCLI",
        dependencies: [
            "ParleyWire",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ],
        swiftSettings: swiftSettings
    ),
    // The fuzzers' targets, and the command libFuzzer drives (scripts/fuzz.sh) or that replays files.
    .target(
        name: "ParleyFuzzTargets",
        dependencies: ["ParleyProtocol", "ParleyServer", "ParleyGStreamer", "ParleyJanus", "ParleyTesting", .product(name: "Logging", package: "swift-log")],
        swiftSettings: swiftSettings
    ),
    // In the AddressSanitizer build (scripts/asan-build.sh) it links libFuzzer, whose driver its
    // main runs: the fuzzers and the sanitized tests share one build. Elsewhere it is the command
    // that replays files.
    .executableTarget(
        name: "ParleyFuzz",
        dependencies: ["ParleyFuzzTargets"],
        swiftSettings: swiftSettings + (libFuzzer != nil ? [.define("PARLEY_LIBFUZZER")] : []),
        linkerSettings: libFuzzer.map { [.unsafeFlags(["-Xlinker", "--whole-archive", "-Xlinker", $0, "-Xlinker", "--no-whole-archive", "-lstdc++"])] } ?? []
    ),
    .testTarget(
        name: "ParleyFuzzTests",
        dependencies: ["ParleyFuzzTargets", "ParleyProtocol", "ParleyWire"],
        swiftSettings: swiftSettings
    ),
    .testTarget(
        name: "ParleyWireTests",
        dependencies: ["ParleyWire"],
        swiftSettings: swiftSettings
    ),
    .testTarget(
        name: "ParleyMediaTests",
        dependencies: [
            "ParleyAPNsTesting",
            "ParleyApple",
            "ParleyNIOTransport",
            "ParleyGStreamer",
            "ParleySoftphone",
            "ParleyKit",
            "ParleyServer",
            "ParleyServerTesting",
            "ParleyProtocol",
            "ParleyWire",
            .product(name: "Logging", package: "swift-log"),
        ] + appleFrameworks,
        exclude: ["Peers"],
        swiftSettings: swiftSettings,
        linkerSettings: exportsEngineWrappers
    ),
    .testTarget(
        name: "ParleyJanusTests",
        dependencies: ["ParleyJanus", "ParleyProtocol", "ParleyServerTesting"],
        exclude: ["Fixtures"],
        swiftSettings: swiftSettings
    ),
    .testTarget(
        name: "ParleyServerTests",
        dependencies: [
            "ParleyServer",
            "ParleyWebSocket",
            "ParleyAPNs",
            "ParleyAPNsTesting",
            .product(name: "Crypto", package: "swift-crypto"),
            "ParleyJanus",
            "ParleyServerTesting",
            "ParleyTesting",
            "ParleyProtocol",
            .product(name: "WSClient", package: "swift-websocket"),
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOWebSocket", package: "swift-nio"),
            .product(name: "NIOEmbedded", package: "swift-nio"),
            .product(name: "HTTPTypes", package: "swift-http-types"),
            .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            .product(name: "GRDB", package: "GRDB.swift"),
        ],
        swiftSettings: swiftSettings
    ),
]
#endif
