import ParleyApple
import SwiftUI
import WebRTC

/// A WebRTC video track on screen (Metal): the far side full size, the camera in a corner.
/// `PhoneModel.media` is the newest call's peer connection; its `remoteVideoTrack` and
/// `localVideoTrack` are what a video call shows.
struct VideoView: UIViewRepresentable {
    let track: RTCVideoTrack?

    func makeUIView(context: Context) -> RTCMTLVideoView {
        let view = RTCMTLVideoView()
        view.videoContentMode = .scaleAspectFill
        return view
    }

    func updateUIView(_ view: RTCMTLVideoView, context: Context) {
        context.coordinator.show(track, in: view)
    }

    static func dismantleUIView(_ view: RTCMTLVideoView, coordinator: Coordinator) {
        coordinator.show(nil, in: view)
    }

    func makeCoordinator() -> Coordinator { Coordinator() }

    final class Coordinator {
        private var shown: RTCVideoTrack?

        func show(_ track: RTCVideoTrack?, in view: RTCMTLVideoView) {
            guard track !== shown else { return }
            shown?.remove(view)
            track?.add(view)
            shown = track
        }
    }
}
