import PostgresNIO

/// The text of a statement the server runs on every call setup.
protocol PreparedSQL {
    static var sql: String { get }
}

/// A hot statement run as a prepared statement: each pooled connection parses and plans it once,
/// and after that only binds and executes it. `parley bench nodes --statements` showed planning
/// as the larger part of these lookups' cost to PostgreSQL when each was sent as a new query.
struct Prepared<Statement: PreparedSQL>: PostgresPreparedStatement {
    typealias Row = PostgresRow

    static var name: String { "parley." + String(describing: Statement.self) }
    static var sql: String { Statement.sql }

    let bindings: PostgresBindings

    /// The statement with `values` for `$1`, `$2`, … in order (nil: NULL). A connection prepares
    /// the statement with the types of the values it is first run with, and a NULL has none: the
    /// statement gives each parameter that may be NULL its type (`$6::TEXT`).
    init(_ values: [(any PostgresDynamicTypeEncodable)?]) {
        var bindings = PostgresBindings(capacity: values.count)
        for value in values {
            if let value { bindings.append(value) } else { bindings.appendNull() }
        }
        self.bindings = bindings
    }

    func makeBindings() -> PostgresBindings { bindings }
    func decodeRow(_ row: PostgresRow) -> PostgresRow { row }
}
