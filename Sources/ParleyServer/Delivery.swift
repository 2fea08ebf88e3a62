import ParleyProtocol

/// A frame for the hub to deliver to one device: what the state machines of calls and rooms answer.
struct Delivery: Equatable {
    var to: DeviceKey
    var message: ServerMessage
}
