import Foundation

/// Where a PostgreSQL server is, read from a libpq-style URL:
///
/// - `postgres://user:password@host:5432/database` over TCP, TLS as `sslmode` says (`disable`,
///   `prefer`, the default, or `require`);
/// - `postgres://user@/database?host=/run/postgresql` over the Unix socket in that directory (the
///   file `.s.PGSQL.<port>`, as libpq names it).
///
/// The user defaults to the process's user and the database to the user, as with libpq; the
/// password may come from `PGPASSWORD` instead of the URL.
public struct PostgresLocation: Sendable, Equatable, CustomStringConvertible {
    public enum Endpoint: Sendable, Equatable {
        case tcp(host: String, port: Int)
        /// The socket file's full path.
        case socket(path: String)
    }

    public enum TLSMode: String, Sendable, Equatable {
        case disable, prefer, require
    }

    public var endpoint: Endpoint
    public var user: String
    public var password: String?
    public var database: String
    public var tls: TLSMode

    /// Whether `text` names PostgreSQL (rather than a SQLite file).
    public static func isURL(_ text: String) -> Bool {
        text.hasPrefix("postgres://") || text.hasPrefix("postgresql://")
    }

    public init(endpoint: Endpoint, user: String, password: String? = nil, database: String, tls: TLSMode = .disable) {
        self.endpoint = endpoint
        self.user = user
        self.password = password
        self.database = database
        self.tls = tls
    }

    public init(url text: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws(ConfigurationError) {
        func refuse(_ why: String) -> ConfigurationError {
            ConfigurationError("\(why) in the database URL (postgres://user:password@host:port/database, or postgres://user@/database?host=/socket/directory)")
        }
        guard Self.isURL(text), let components = URLComponents(string: text) else { throw refuse("not a postgres:// URL") }
        var query: [String: String] = [:]
        for item in components.queryItems ?? [] {
            guard let value = item.value, query.updateValue(value, forKey: item.name) == nil else {
                throw refuse("\"\(item.name)\" given without a value or twice")
            }
        }
        let known: Set = ["host", "port", "sslmode", "user", "password", "dbname"]
        if let unknown = query.keys.sorted().first(where: { !known.contains($0) }) { throw refuse("unknown parameter \"\(unknown)\"") }

        let portText = query["port"] ?? components.port.map(String.init) ?? "5432"
        guard let port = Int(portText), (1...65535).contains(port) else { throw refuse("port \(portText) out of range") }
        let host = query["host"] ?? components.percentEncodedHost.flatMap { $0.removingPercentEncoding }.flatMap { $0.isEmpty ? nil : $0 }
        if let host, host.hasPrefix("/") {
            endpoint = .socket(path: (host as NSString).appendingPathComponent(".s.PGSQL.\(port)"))
        } else if let host {
            endpoint = .tcp(host: host.trimmingCharacters(in: CharacterSet(charactersIn: "[]")), port: port)
        } else {
            // libpq's default: the Unix socket in Debian's directory.
            endpoint = .socket(path: "/var/run/postgresql/.s.PGSQL.\(port)")
        }
        guard let user = query["user"] ?? components.user?.removingPercentEncoding ?? Self.processUser() else {
            throw refuse("no user")
        }
        self.user = user
        password = query["password"] ?? components.password?.removingPercentEncoding ?? environment["PGPASSWORD"]
        let path = String(components.path.drop(while: { $0 == "/" })).removingPercentEncoding ?? ""
        database = query["dbname"] ?? (path.isEmpty ? user : path)
        guard !database.contains("/") else { throw refuse("a database name with a slash") }
        let mode = query["sslmode"] ?? (Self.isLocal(endpoint) ? "disable" : "prefer")
        guard let tls = TLSMode(rawValue: mode) else { throw refuse("sslmode \(mode) (use disable, prefer or require)") }
        if case .socket = endpoint, tls == .require { throw refuse("sslmode=require over a Unix socket") }
        self.tls = tls
    }

    /// For logs: everything but the password.
    public var description: String {
        switch endpoint {
        case .tcp(let host, let port):
            "postgres://\(user)@\(host.contains(":") ? "[\(host)]" : host):\(port)/\(database)"
        case .socket(let path):
            "postgres://\(user)@/\(database) (socket \(path))"
        }
    }

    private static func isLocal(_ endpoint: Endpoint) -> Bool {
        switch endpoint {
        case .socket: true
        case .tcp(let host, _): host == "localhost" || host == "::1" || host.hasPrefix("127.")
        }
    }

    private static func processUser() -> String? {
        guard let entry = getpwuid(geteuid()), let name = entry.pointee.pw_name else { return nil }
        return String(cString: name)
    }
}
