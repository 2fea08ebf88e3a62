// An app depends on the one product ParleyApple and imports it alone: the SDK core's and the
// protocol's types (calls, users, rooms) are part of its API.
@_exported import ParleyKit
@_exported import ParleyProtocol
@_exported import ParleyRooms
