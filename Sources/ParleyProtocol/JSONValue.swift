import Foundation

/// Any JSON value, for the open-ended parts of the protocol (`metadata`, ack results).
public enum JSONValue: Sendable, Hashable, Codable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            // Field by field in the order of their names: of an object with several bad values the
            // same one is named every time (Foundation's decoder lists an object's keys in an order
            // of its own, which differs from one decoding to the next).
            let object = try decoder.container(keyedBy: AnyKey.self)
            var fields: [String: JSONValue] = [:]
            for key in object.allKeys.sorted(by: { $0.stringValue < $1.stringValue }) {
                fields[key.stringValue] = try object.decode(JSONValue.self, forKey: key)
            }
            self = .object(fields)
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .number(let value):
            // Whole numbers are written without a fraction, as other JSON producers do.
            if value.rounded() == value, abs(value) < 9.007_199_254_740_992e15 {
                try container.encode(Int64(value))
            } else {
                try container.encode(value)
            }
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    public subscript(key: String) -> JSONValue? {
        if case .object(let object) = self { return object[key] }
        return nil
    }

    public var stringValue: String? {
        if case .string(let value) = self { return value }
        return nil
    }
}

extension JSONValue {
    /// The fields of `value`, which must encode as a JSON object (an ack's result struct, say).
    public static func fields(of value: some Encodable) throws -> [String: JSONValue] {
        let data = try JSONEncoder().encode(value)
        guard case .object(let object) = try JSONDecoder().decode(JSONValue.self, from: data) else {
            throw EncodingError.invalidValue(value, .init(codingPath: [], debugDescription: "the value must encode as a JSON object"))
        }
        return object
    }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByBooleanLiteral {
    public init(stringLiteral value: String) { self = .string(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
}
