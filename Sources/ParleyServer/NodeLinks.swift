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
/// A frame carries what one batch of the cluster's sender has for one node, a line a message,
/// separated by newlines (no line holds one): `<number> <json>` as `NOTIFY` carries them, or
/// `<number> <compact line>` (`NodeLine`) to a node that published that it reads them, or
/// `<number> @<row>` for a message larger than a frame, kept in `cluster_message`. A number is
/// `<count>v<version>@<node>` (`PostgresCluster.shown(by:)`).
///
/// A node that published no address (`--node-bus postgres`, a wildcard `--host` without
/// `--node-address`, an older build) is sent to by `NOTIFY`, and so is one whose link cannot be made
/// within `connectTimeout` while the directory counts it live, or closes within `steadyAfter`
/// (tried again after a backoff), and one this node sends only news for every node before it has
/// learnt its address. The two paths are not ordered with each other: messages around such a
/// switch may arrive out of order. A link pings every `pingInterval` (the receiving node reads its
/// frames apart from handling them, so it answers however busy): one whose path died silently
/// closes within two, and what was written on it meanwhile is lost, as it is when its node dies.
///
/// Used by the cluster's one sending task only (`PostgresCluster.send`), which owns it.
final class NodeLinks {
    static let path = "/v1/cluster"
    static let nodeHeader = HTTPField.Name("Parley-Node")!
    /// The linking node's `NodeLine.version`; absent from a build before version 3.
    static let versionHeader = HTTPField.Name("Parley-Node-Version")!
    /// A frame's lines stop short of this (one line may reach it): the 64 KiB frame limit of the
    /// node's WebSocket server holds it.
    static let frameLimit = 60_000
    static let connectTimeout = Duration.seconds(2)
    static let pingInterval = Duration.seconds(5)
    /// How far a link's time may be from the receiving node's (the clocks of a deployment's hosts
    /// agree far better): a link's authorization is good for this long either way.
    static let clockSkew: Int64 = 60

    /// A link that closes sooner than this after it was made counts as one that could not be made
    /// (a node that takes links and drops them must not be linked to again on every batch).
    static let steadyAfter = Duration.seconds(10)

    let node: NodeID
    private let key: SymmetricKey
    private let logger: Logger
    private var links: [NodeID: (link: TextWebSocket, since: ContinuousClock.Instant)] = [:]
    /// What the directory said of a node's address, and when to ask again (a node publishes its
    /// address once it listens; one whose link failed is tried again after a backoff).
    private var addresses: [NodeID: Address] = [:]

    private struct Address {
        var address: String?
        /// The version the node published (`NodeLine.version`): 1 reads JSON only.
        var version = 1
        var askAgain: ContinuousClock.Instant
        var failures = 0
    }

    /// What the directory says of a node: where it takes links, and its version (`NodeLine.version`).
    struct Published {
        var address: String
        var version: Int
    }

    /// A line for a node: its JSON, which every node reads, and its compact form if it has one.
    struct Line {
        var to: NodeID
        var json: JSONLine
        var compact: String?
        var broadcast: Bool
    }

    /// A message's JSON line, made when a node needs it: a message with a compact line reaches a
    /// node that reads those without one (encoding it cost more than anything else a link does).
    /// Made once however many nodes need it; the sending task's own, like the links.
    final class JSONLine {
        private var made: String?
        private let make: () -> String

        init(_ line: String) {
            made = line
            make = { line }
        }

        init(making make: @escaping () -> String) {
            self.make = make
        }

        var line: String {
            if let made { return made }
            let line = make()
            made = line
            return line
        }
    }

    init(node: NodeID, key: SymmetricKey, logger: Logger) {
        self.node = node
        self.key = key
        self.logger = logger
    }

    // MARK: Who may link

    /// What a node linking `from` → `to` at `time` (Unix seconds) shows: an HMAC of the two ids and
    /// the time with the deployment's key, which every node reads from the database
    /// (`deployment_secret`) and nobody configures. Good for `clockSkew` either side of `time`.
    static func authorization(from: NodeID, to: NodeID, time: Int64, key: SymmetricKey) -> String {
        DeploymentSecret.hex(HMAC<SHA256>.authenticationCode(for: Data(signed(from: from, to: to, time: time).utf8), using: key))
    }

    /// The `Parley-Node` header of a link: the linking node and its time.
    static func nodeHeaderValue(from: NodeID, time: Int64) -> String { "\(from) \(time)" }

    /// The node a link says it comes from, when it holds this deployment's key for the pair and its
    /// time is within `clockSkew` of `now` (compared in constant time).
    static func linkingNode(header: String, to: NodeID, authorization: String, now: Int64, key: SymmetricKey) -> NodeID? {
        let parts = header.split(separator: " ")
        guard parts.count == 2, let time = Int64(parts[1]), abs(now - time) <= clockSkew,
              let code = DeploymentSecret.bytes(hex: authorization) else { return nil }
        let from = String(parts[0])
        guard HMAC<SHA256>.isValidAuthenticationCode(code, authenticating: Data(signed(from: from, to: to, time: time).utf8),
                                                      using: key) else { return nil }
        return from
    }

    private static func signed(from: NodeID, to: NodeID, time: Int64) -> String { "parley-node-link \(from) \(to) \(time)" }

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
    /// published no address, or its link cannot be made), for `NOTIFY`. `lookup` reads the
    /// directory's addresses of the nodes asked about. A node that news for every node (`broadcast`)
    /// finds without a link is not looked up for it: a node that has just joined publishes its
    /// address once it listens, and what is sent to it after that must not wait on a second's miss.
    /// Answers, beside the lines for `NOTIFY`, how many compact lines the links carried.
    func send(_ lines: [Line], lookup: ([NodeID]) async throws -> [NodeID: Published]) async -> (undelivered: [(to: NodeID, line: String)], compact: Int) {
        // Links whose connection ended (their node stopped, or their path died) are made anew.
        for (node, entry) in links where entry.link.isClosed { dropLink(to: node) }
        var byNode: [NodeID: [Line]] = [:]
        var order: [NodeID] = []
        var targeted: Set<NodeID> = []
        for line in lines {
            if byNode[line.to] == nil { order.append(line.to) }
            byNode[line.to, default: []].append(line)
            if !line.broadcast { targeted.insert(line.to) }
        }
        let now = ContinuousClock.now
        let unknown = order.filter { to in
            targeted.contains(to) && links[to] == nil && (addresses[to].map { now >= $0.askAgain } ?? true)
        }
        if !unknown.isEmpty {
            do {
                let found = try await lookup(unknown)
                for to in unknown {
                    var entry = addresses[to] ?? Address(address: nil, askAgain: now)
                    entry.address = found[to]?.address
                    entry.version = found[to]?.version ?? 1
                    // Found: tried at once. Not found: the node has not listened yet (or never
                    // publishes), asked again in a second.
                    entry.askAgain = found[to] == nil ? now + .seconds(1) : now
                    addresses[to] = entry
                }
            } catch {
                // Asked again in a second, not on every batch.
                for to in unknown { addresses[to, default: Address(address: nil, askAgain: now)].askAgain = now + .seconds(1) }
                logger.warning("could not read the other nodes' addresses", metadata: ["error": "\(PostgresStore.explain(error))"])
            }
        }
        var undelivered: [(to: NodeID, line: String)] = []
        var compactSent = 0
        for to in order {
            let compact = (addresses[to]?.version ?? 1) >= NodeLine.compactSince
            let lines = (byNode[to] ?? []).map { compact ? ($0.compact ?? $0.json.line) : $0.json.line }
            // What a link does not carry goes by NOTIFY, which every node reads as JSON.
            let unsent = await send(lines, to: to)
            undelivered += (byNode[to] ?? []).suffix(unsent.count).map { (to, $0.json.line) }
            if compact { compactSent += (byNode[to] ?? []).dropLast(unsent.count).filter { $0.compact != nil }.count }
        }
        return (undelivered, compactSent)
    }

    /// Sends `lines` on the node's link, in frames; answers the lines not sent. A link found closed
    /// is made again, once: what its frames did not carry goes on the new one, in order.
    private func send(_ lines: [String], to: NodeID) async -> [String] {
        var frames = Self.frames(of: lines)[...]
        for attempt in 0..<2 {
            guard let link = await link(to: to, fresh: attempt > 0) else { break }
            while let frame = frames.first, link.send(frame.joined(separator: "\n")) { frames.removeFirst() }
            if frames.isEmpty { return [] }
            dropLink(to: to)
        }
        return frames.flatMap { $0 }
    }

    /// Forgets a node's link (closed, or found closing): one that lived less than `steadyAfter`
    /// counts as a failure, and the node is linked to again after the backoff.
    private func dropLink(to: NodeID) {
        guard let (link, since) = links.removeValue(forKey: to) else { return }
        link.close()
        let now = ContinuousClock.now
        if now - since < Self.steadyAfter {
            backOff(to, now: now)
        } else {
            addresses[to]?.failures = 0
        }
    }

    /// The next try at a node's link after 1, 2, 4 … 30 s; its address is kept (and looked up
    /// again then for a node sent its own messages).
    private func backOff(_ to: NodeID, now: ContinuousClock.Instant) {
        var entry = addresses[to] ?? Address(address: nil, askAgain: now)
        entry.failures += 1
        entry.askAgain = now + .seconds(min(30, 1 << min(entry.failures - 1, 5)))
        addresses[to] = entry
    }

    private func link(to: NodeID, fresh: Bool) async -> TextWebSocket? {
        if !fresh, let link = links[to]?.link { return link }
        let now = ContinuousClock.now
        guard let entry = addresses[to], now >= entry.askAgain, let address = entry.address, let url = Self.url(address: address) else {
            return nil
        }
        let time = Int64(Date().timeIntervalSince1970)
        let headers: HTTPFields = [.authorization: "Bearer \(Self.authorization(from: node, to: to, time: time, key: key))",
                                   Self.nodeHeader: Self.nodeHeaderValue(from: node, time: time),
                                   Self.versionHeader: "\(NodeLine.version)"]
        do {
            let link = try await withThrowingTaskGroup(of: TextWebSocket?.self) { group in
                group.addTask {
                    try await TextWebSocket.connect(to: url, headers: headers, maxFrameSize: 1 << 16, autoPing: Self.pingInterval)
                }
                group.addTask {
                    try await Task.sleep(for: Self.connectTimeout)
                    return nil
                }
                let first = try await group.next() ?? nil
                group.cancelAll()
                // A connection made as the time ran out is not kept open for nothing.
                while !group.isEmpty {
                    if case let late?? = try? await group.next() { late.close() }
                }
                return first
            }
            guard let link else { throw LinkError("no answer within \(Self.connectTimeout)") }
            links[to] = (link, ContinuousClock.now)
            logger.info("linked to a node", metadata: ["cluster.peer": "\(to)", "cluster.address": "\(address)"])
            return link
        } catch {
            // Tried again after a backoff: a node the directory counts live whose link cannot be
            // made must not hold every batch for `connectTimeout`.
            backOff(to, now: now)
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

    /// Closes every link once what is queued on it is written (each within its close timeout;
    /// not awaited: a peer that stopped reading must not hold this node's stop).
    func close() {
        for entry in links.values { entry.link.close() }
        links = [:]
    }

    private struct LinkError: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }
}
