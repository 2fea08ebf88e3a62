import Logging
import ParleyGStreamer
import ParleyKit
import ParleyProtocol
@_exported import ParleyRooms

extension RoomSession {
    /// A room session whose media is the GStreamer engine, with audio levels on for the mixer.
    public init(room: RoomID, display: String, signaling: SignalingClient<ContinuousClock>, media: MediaEngineConfiguration,
                logger: Logger) throws {
        var media = media
        media.audioLevelIndication = true
        self.init(room: room, display: display, signaling: signaling, peers: try GStreamerEngine(configuration: media, logger: logger),
                  logger: logger)
    }
}
