import ParleyProtocol

/// A device of a user: where frames are delivered.
public struct DeviceKey: Hashable, Sendable, CustomStringConvertible {
    public var user: UserID
    public var device: DeviceID

    public init(user: UserID, device: DeviceID) {
        self.user = user
        self.device = device
    }

    public var description: String { "\(user)/\(device)" }
}

extension Party {
    var key: DeviceKey { DeviceKey(user: user, device: device) }
}
