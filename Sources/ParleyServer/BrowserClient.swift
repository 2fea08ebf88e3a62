import HTTPTypes
import Hummingbird

/// The browser client served at `/`: plain JavaScript modules from `Web/`, compiled into the
/// server (SwiftPM `embedInCode`), so a server binary carries its own client and needs no files.
enum BrowserClient {
    struct Asset: Sendable {
        let body: [UInt8]
        let contentType: String
    }

    static let assets: [String: Asset] = [
        "index.html": Asset(body: PackageResources.index_html, contentType: "text/html; charset=utf-8"),
        "style.css": Asset(body: PackageResources.style_css, contentType: "text/css; charset=utf-8"),
        "app.js": Asset(body: PackageResources.app_js, contentType: "text/javascript; charset=utf-8"),
        "audio.js": Asset(body: PackageResources.audio_js, contentType: "text/javascript; charset=utf-8"),
        "call.js": Asset(body: PackageResources.call_js, contentType: "text/javascript; charset=utf-8"),
        "graph.js": Asset(body: PackageResources.graph_js, contentType: "text/javascript; charset=utf-8"),
        "janus.js": Asset(body: PackageResources.janus_js, contentType: "text/javascript; charset=utf-8"),
        "quality.js": Asset(body: PackageResources.quality_js, contentType: "text/javascript; charset=utf-8"),
        "rooms.js": Asset(body: PackageResources.rooms_js, contentType: "text/javascript; charset=utf-8"),
        "signaling.js": Asset(body: PackageResources.signaling_js, contentType: "text/javascript; charset=utf-8"),
    ]

    /// Everything the page loads comes from this server; it connects only to this server and, for
    /// AudioBridge rooms, to Janus; media only from the browser's own devices.
    static func contentSecurityPolicy(janusURL: String?) -> String {
        let connect = ["'self'"] + (janusURL.map { [$0] } ?? [])
        return "default-src 'self'; connect-src \(connect.joined(separator: " ")); media-src 'self' blob: mediastream:; "
            + "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    }

    static func register(on router: Router<ParleyRequestContext>, janusURL: String?) {
        let policy = contentSecurityPolicy(janusURL: janusURL)
        router.get("/") { _, _ in response(for: "index.html", policy: policy) }
        router.get("/index.html") { _, _ in response(for: "index.html", policy: policy) }
        router.get("/app/:file") { _, context in response(for: context.parameters.get("file") ?? "", policy: policy) }
    }

    static func response(for name: String, policy: String) -> Response {
        guard let asset = assets[name] else {
            return Response(status: .notFound, headers: [.contentType: "text/plain; charset=utf-8"],
                            body: .init(byteBuffer: ByteBuffer(string: "not found\n")))
        }
        let headers: HTTPFields = [
            .contentType: asset.contentType,
            // The files change with the server: always revalidate, so an upgraded server serves its own client.
            .cacheControl: "no-cache",
            .contentSecurityPolicy: policy,
            HTTPField.Name("X-Content-Type-Options")!: "nosniff",
        ]
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: asset.body)))
    }
}
