import Crypto
import Foundation
import HTTPTypes
import Logging
import ParleyWebSocket

/// The direct links of `NodeBus.direct`: a WebSocket from this node to each node it sends to, at
/// the address that node published in the directory (`cluster_node`), on that node's own listening
/// port at `/v1/cluster`. One link per pair of nodes and one sender on each side, so a node's
/// messages to another arrive in the order it sent them, as with `NOTIFY`.
///
/// A frame carries what one batch of the cluster's sender has for one node: the messages' lines as
/// `NOTIFY` carries them (`<number> <json>`, or `<number> @<row>` for one kept in `cluster_message`),
/// separated by newlines (JSON text holds none).
///
/// A node that published no address (a wildcard `--host` without `--node-address`, or an older
/// build) is sent to by `NOTIFY`, and so is one that cannot be reached within `connectTimeout` while
/// the directory counts it live: a link that fails costs the latency, not the message.
///
/// Used by the cluster's one sending task only (`PostgresCluster.send`), which owns it.
final class NodeLinks {
    static let path = "/v1/cluster"
    static let nodeHeader = HTTPField.Name("Parley-Node")!
    /// A frame's lines stop short of this (one line may reach it): the 64 KiB frame limit of the
    /// node's WebSocket server holds it.
    static let frameLimit = 60_000
    static let connectTimeout = Duration.seconds(2)
    /// How long a node found without an address is sent to by `NOTIFY` before it is looked up again
    /// (a node publishes its address once it listens, a moment after it joins).
    static let unknownFor = Duration.seconds(1)

    let node: NodeID
    private let key: SymmetricKey
    private let logger: Logger
    private var links: [NodeID: TextWebSocket] = [:]
    /// What the directory said of each node's address, and when.
    private var addresses: [NodeID: (address: String?, at: ContinuousClock.Instant)] = [:]

    init(node: NodeID, key: SymmetricKey, logger: Logger) {
        self.node = node
        self.key = key
        self.logger = logger
    }

    // MARK: Who may link

    /// What a node linking `from` → `to` shows: an HMAC of both ids with the deployment's key,
    /// which every node reads from the database (`deployment_secret`) and nobody configures.
    static func authorization(from: NodeID, to: NodeID, key: SymmetricKey) -> String {
        HMAC<SHA256>.authenticationCode(for: Data("parley-node-link \(from) \(to)".utf8), using: key)
            .map { String(format: "%02x", $0) }.joined()
    }

    /// Whether a link that says it comes from `from` holds this deployment's key (compared in
    /// constant time).
    static func accepts(from: NodeID, to: NodeID, authorization: String, key: SymmetricKey) -> Bool {
        guard let code = bytes(hex: authorization) else { return false }
        return HMAC<SHA256>.isValidAuthenticationCode(code, authenticating: Data("parley-node-link \(from) \(to)".utf8), using: key)
    }

    private static func bytes(hex: String) -> [UInt8]? {
        let digits = Array(hex.utf8)
        guard digits.count == 64 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        for index in stride(from: 0, to: 64, by: 2) {
            guard let byte = UInt8(String(decoding: digits[index...index + 1], as: UTF8.self), radix: 16) else { return nil }
            bytes.append(byte)
        }
        return bytes
    }

    /// The WebSocket URL of a node's links from its published `host:port` (an IPv6 host in brackets).
    static func url(address: String) -> String? {
        guard let colon = address.lastIndex(of: ":"), let port = Int(address[address.index(after: colon)...]),
              (1...65535).contains(port) else { return nil }
        let host = address[..<colon]
        guard !host.isEmpty, !host.contains("/"), !host.contains(" "),
              !host.contains(":") || (host.hasPrefix("[") && host.hasSuffix("]")) else { return nil }
        return "ws://\(address)\(path)"
    }

    // MARK: Sending

    /// Sends each line to its node over that node's link; answers the lines it could not (the node
    /// published no address, or its link cannot be made or has closed), for `NOTIFY`.
    /// `lookup` reads the directory's addresses of the nodes asked about.
    func send(_ lines: [(to: NodeID, line: String)],
              lookup: ([NodeID]) async throws -> [NodeID: String]) async -> [(to: NodeID, line: String)] {
        var byNode: [NodeID: [String]] = [:]
        var order: [NodeID] = []
        for (to, line) in lines {
            if byNode[to] == nil { order.append(to) }
            byNode[to, default: []].append(line)
        }
        let now = ContinuousClock.now
        let unknown = order.filter { to in
            links[to] == nil && addresses[to].map { $0.address == nil && now - $0.at >= Self.unknownFor } ?? true
        }
        if !unknown.isEmpty {
            do {
                let found = try await lookup(unknown)
                for to in unknown { addresses[to] = (found[to], now) }
            } catch {
                logger.warning("could not read the other nodes' addresses", metadata: ["error": "\(PostgresStore.explain(error))"])
            }
        }
        var undelivered: [(to: NodeID, line: String)] = []
        for to in order {
            undelivered += await send(byNode[to] ?? [], to: to).map { (to, $0) }
        }
        return undelivered
    }

    /// Sends `lines` on the node's link, in frames; answers the lines not sent. A link found closed
    /// is made again, once: what its frames did not carry goes on the new one, in order.
    private func send(_ lines: [String], to: NodeID) async -> [String] {
        var frames = Self.frames(of: lines)[...]
        for attempt in 0..<2 {
            guard let link = await link(to: to, fresh: attempt > 0) else { break }
            while let frame = frames.first, link.send(frame.joined(separator: "\n")) { frames.removeFirst() }
            if frames.isEmpty { return [] }
            links[to] = nil
            link.close()
        }
        return frames.flatMap { $0 }
    }

    private func link(to: NodeID, fresh: Bool) async -> TextWebSocket? {
        if !fresh, let link = links[to] { return link }
        guard let address = addresses[to]?.address, let url = Self.url(address: address) else { return nil }
        let headers: HTTPFields = [.authorization: "Bearer \(Self.authorization(from: node, to: to, key: key))", Self.nodeHeader: node]
        do {
            let link = try await withThrowingTaskGroup(of: TextWebSocket?.self) { group in
                group.addTask { try await TextWebSocket.connect(to: url, headers: headers, maxFrameSize: 1 << 16) }
                group.addTask {
                    try await Task.sleep(for: Self.connectTimeout)
                    return nil
                }
                defer { group.cancelAll() }
                return try await group.next() ?? nil
            }
            guard let link else { throw LinkError("no answer within \(Self.connectTimeout)") }
            links[to] = link
            logger.debug("linked to a node", metadata: ["cluster.peer": "\(to)", "cluster.address": "\(address)"])
            return link
        } catch {
            // Looked up again after a while: the node may have moved, or be gone.
            addresses[to] = nil
            logger.warning("could not link to a node; its messages go by NOTIFY",
                           metadata: ["cluster.peer": "\(to)", "cluster.address": "\(address)", "error": "\(error)"])
            return nil
        }
    }

    /// Lines in frames of at most `frameLimit` bytes joined by newlines (one longer line is a frame
    /// of its own).
    static func frames(of lines: [String]) -> [[String]] {
        var frames: [[String]] = []
        var frame: [String] = [], size = 0
        for line in lines {
            let added = line.utf8.count + (frame.isEmpty ? 0 : 1)
            if !frame.isEmpty, size + added > frameLimit {
                frames.append(frame)
                frame = []
                size = 0
            }
            size += line.utf8.count + (frame.isEmpty ? 0 : 1)
            frame.append(line)
        }
        if !frame.isEmpty { frames.append(frame) }
        return frames
    }

    /// Closes every link, once what was queued on them is written.
    func close() async {
        let all = Array(links.values)
        links = [:]
        for link in all { link.close() }
        for link in all { await link.closed() }
    }

    private struct LinkError: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }
}
