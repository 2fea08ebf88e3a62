/// A string identifier of the protocol with a rule for what it may contain: it decodes only when
/// valid (with an error that states the rule), encodes as its string, and can be written as a literal.
public protocol ValidatedIdentifier: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible,
    ExpressibleByStringLiteral where RawValue == String {
    init?(rawValue: String)
    /// What a valid value looks like, for error messages.
    static var rule: String { get }
}

extension ValidatedIdentifier {
    public init(from decoder: any Decoder) throws {
        let raw = try decoder.singleValueContainer().decode(String.self)
        guard let value = Self(rawValue: raw) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: Self.rule))
        }
        self = value
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }

    public init(stringLiteral value: String) {
        guard let id = Self(rawValue: value) else { preconditionFailure("'\(value)' is not valid: \(Self.rule)") }
        self = id
    }

    public var description: String { rawValue }
}

/// A user id: 1–64 characters of `[A-Za-z0-9._@-]` (the JWT `sub` claim).
public struct UserID: ValidatedIdentifier, Comparable {
    public let rawValue: String
    public static let rule = "a user id is 1-64 characters of A-Z a-z 0-9 . _ @ -"

    public init?(rawValue: String) {
        guard Identifier.isValid(rawValue, maxLength: 64, extra: []) else { return nil }
        self.rawValue = rawValue
    }

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// A device id, stable per install: 1–128 characters of `[A-Za-z0-9._:@-]`.
public struct DeviceID: ValidatedIdentifier, Comparable {
    public let rawValue: String
    public static let rule = "a device id is 1-128 characters of A-Z a-z 0-9 . _ : @ -"

    public init?(rawValue: String) {
        guard Identifier.isValid(rawValue, maxLength: 128, extra: [UInt8(ascii: ":")]) else { return nil }
        self.rawValue = rawValue
    }

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// A room name: 1–64 characters of `[A-Za-z0-9._:@-]`.
public struct RoomID: ValidatedIdentifier {
    public let rawValue: String
    public static let rule = "a room name is 1-64 characters of A-Z a-z 0-9 . _ : @ -"

    public init?(rawValue: String) {
        guard Identifier.isValid(rawValue, maxLength: 64, extra: [UInt8(ascii: ":")]) else { return nil }
        self.rawValue = rawValue
    }
}

/// A call id: a UUID chosen by the caller. Compared case-insensitively; written in lowercase.
public struct CallID: ValidatedIdentifier {
    public let rawValue: String
    public static let rule = "a call id is a UUID like 6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"

    public init?(rawValue: String) {
        guard Self.isUUID(rawValue) else { return nil }
        self.rawValue = rawValue.lowercased()
    }

    /// A new random call id.
    public static func random() -> CallID {
        var generator = SystemRandomNumberGenerator()
        var bytes = (0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) }
        bytes[6] = (bytes[6] & 0x0F) | 0x40
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        let hex = bytes.map { byte in
            let digits = Array("0123456789abcdef")
            return String([digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]])
        }
        let text = hex[0..<4].joined() + "-" + hex[4..<6].joined() + "-" + hex[6..<8].joined() + "-"
            + hex[8..<10].joined() + "-" + hex[10..<16].joined()
        return CallID(rawValue: text)!
    }

    static func isUUID(_ value: String) -> Bool {
        let utf8 = Array(value.utf8)
        guard utf8.count == 36 else { return false }
        for (index, byte) in utf8.enumerated() {
            if index == 8 || index == 13 || index == 18 || index == 23 {
                guard byte == UInt8(ascii: "-") else { return false }
            } else {
                let isHex = (byte >= 48 && byte <= 57) || (byte >= 65 && byte <= 70) || (byte >= 97 && byte <= 102)
                guard isHex else { return false }
            }
        }
        return true
    }
}

enum Identifier {
    static func isValid(_ value: String, maxLength: Int, extra: Set<UInt8>) -> Bool {
        let utf8 = value.utf8
        guard !utf8.isEmpty, utf8.count <= maxLength else { return false }
        return utf8.allSatisfy { byte in
            (byte >= 48 && byte <= 57) || (byte >= 65 && byte <= 90) || (byte >= 97 && byte <= 122)
                || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "@")
                || byte == UInt8(ascii: "-") || extra.contains(byte)
        }
    }
}
