import CParleyGst
import Foundation

/// A WebRTC data channel (SCTP over DTLS): text or binary messages, ordered or not.
public final class DataChannel: @unchecked Sendable {
    public enum Event: Hashable, Sendable {
        case open
        case text(String)
        case binary(Data)
        case closed
        case error(String)
    }

    public let label: String
    public let ordered: Bool
    /// What happens on the channel, from the moment it is announced.
    public let events: AsyncStream<Event>
    private let sink: AsyncStream<Event>.Continuation
    private let lock = NSLock()
    /// The GstWebRTCDataChannel, until the peer connection closes.
    private var channel: UnsafeMutableRawPointer?
    private var context: UnsafeMutableRawPointer?

    /// Takes ownership of a GstWebRTCDataChannel reference.
    init(taking channel: UnsafeMutableRawPointer) {
        self.channel = channel
        label = GStreamerPeerConnection.take(parley_channel_label(channel)) ?? ""
        ordered = parley_channel_ordered(channel) != 0
        (events, sink) = AsyncStream.makeStream()
        let context = Unmanaged.passRetained(Listener(sink: sink)).toOpaque()
        self.context = context
        parley_channel_attach(channel, channelCallback, context)
        // A channel the far side opened may be open before anyone listens.
        if parley_channel_ready_state(channel) == 2 { sink.yield(.open) }  // GST_WEBRTC_DATA_CHANNEL_STATE_OPEN
    }

    deinit { detach() }

    public var isOpen: Bool { lock.withLock { channel.map { parley_channel_ready_state($0) == 2 } ?? false } }

    /// Sends text; a channel whose call is over drops it.
    public func send(_ text: String) { lock.withLock { channel.map { parley_channel_send_text($0, text) } } }

    public func send(_ data: Data) {
        lock.withLock {
            guard let channel else { return }
            data.withUnsafeBytes { parley_channel_send_binary(channel, $0.baseAddress, $0.count) }
        }
    }

    public func close() { lock.withLock { channel.map { parley_channel_close($0) } } }

    /// The peer connection closed: let go of the GStreamer channel.
    func detach() {
        let (channel, context): (UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) = lock.withLock {
            defer { self.channel = nil; self.context = nil }
            return (self.channel, self.context)
        }
        guard let channel else { return }
        if let context {
            parley_channel_detach(channel, context)
            Unmanaged<Listener>.fromOpaque(context).release()
        }
        parley_object_unref(channel)
        sink.finish()
    }

    final class Listener {
        let sink: AsyncStream<Event>.Continuation
        init(sink: AsyncStream<Event>.Continuation) { self.sink = sink }

        func handle(_ kind: Int32, _ bytes: UnsafeRawPointer?, _ count: Int) {
            switch kind {
            case Int32(PARLEY_CHANNEL_OPEN.rawValue): sink.yield(.open)
            case Int32(PARLEY_CHANNEL_TEXT.rawValue):
                let text = bytes.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: count), as: UTF8.self) } ?? ""
                sink.yield(.text(text))
            case Int32(PARLEY_CHANNEL_BINARY.rawValue):
                sink.yield(.binary(bytes.map { Data(bytes: $0, count: count) } ?? Data()))
            case Int32(PARLEY_CHANNEL_CLOSED.rawValue): sink.yield(.closed)
            case Int32(PARLEY_CHANNEL_ERROR.rawValue):
                let text = bytes.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: count), as: UTF8.self) } ?? ""
                sink.yield(.error(text))
            default: break
            }
        }
    }
}

let channelCallback: parley_channel_callback = { context, kind, bytes, count in
    guard let context else { return }
    Unmanaged<DataChannel.Listener>.fromOpaque(context).takeUnretainedValue().handle(kind, bytes, count)
}
