/// The page served at `/`.
enum BrowserClient {
    // The full browser softphone is its own piece of work; until it lands, `/` says what this
    // server is and where its endpoints are, rather than pretending to be the client.
    static let placeholderPage = """
        <!doctype html>
        <html lang="en">
        <head><meta charset="utf-8"><title>Parley signaling server</title></head>
        <body>
        <h1>Parley signaling server</h1>
        <p>This server speaks the Parley signaling protocol v1 over WebSocket at <code>/v1/signal</code>.</p>
        <p>Health: <a href="/healthz">/healthz</a> · Metrics: <a href="/metrics">/metrics</a></p>
        <p>The browser client is not part of this build yet.</p>
        </body>
        </html>
        """
}
