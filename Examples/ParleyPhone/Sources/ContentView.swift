import AVKit
import ParleyApple
import SwiftUI

struct ContentView: View {
    let model: PhoneModel

    var body: some View {
        NavigationStack {
            Group {
                switch model.signIn {
                case .signedOut, .signingIn: SignInView(model: model)
                case .signedIn(let user): PhoneView(model: model, user: user)
                }
            }
            .navigationTitle("Parley")
        }
        .alert("Something went wrong", isPresented: Binding(get: { model.problem != nil }, set: { if !$0 { model.dismissProblem() } })) {
            Button("OK") { model.dismissProblem() }
        } message: {
            Text(model.problem ?? "")
        }
    }
}

struct SignInView: View {
    let model: PhoneModel
    @State private var server = AppSettings.server.absoluteString
    @State private var user = ""

    var body: some View {
        Form {
            Section("Server") {
                TextField("http://192.168.1.10:8080", text: $server)
                    .keyboardType(.URL).textInputAutocapitalization(.never).autocorrectionDisabled()
            }
            Section("You") {
                TextField("user id, e.g. alice", text: $user)
                    .textInputAutocapitalization(.never).autocorrectionDisabled()
            }
            Button(model.signIn == .signingIn ? "Signing in…" : "Sign in") {
                guard let url = URL(string: server) else { return }
                Task { await model.signIn(server: url, user: user) }
            }
            .disabled(user.isEmpty || model.signIn == .signingIn)
        }
    }
}

struct PhoneView: View {
    let model: PhoneModel
    let user: UserID
    @State private var callee = ""

    var body: some View {
        List {
            Section("Call") {
                HStack {
                    TextField("who? (user id)", text: $callee)
                        .textInputAutocapitalization(.never).autocorrectionDisabled()
                    Button {
                        Task { await model.call(callee) }
                    } label: {
                        Image(systemName: "phone.fill")
                    }
                    .disabled(callee.isEmpty)
                    .accessibilityLabel("Call \(callee)")
                    Button {
                        Task { await model.call(callee, video: true) }
                    } label: {
                        Image(systemName: "video.fill")
                    }
                    .disabled(callee.isEmpty)
                    .accessibilityLabel("Video call \(callee)")
                }
            }
            if !model.calls.isEmpty {
                Section("Now") {
                    ForEach(model.calls) { call in CallRow(model: model, call: call) }
                }
            }
            Section("More") {
                NavigationLink("Recent calls") { HistoryView(model: model, user: user) }
                NavigationLink("Voice room") { RoomView(model: model) }
            }
            Section {
                Button("Sign out \(user.rawValue)", role: .destructive) { Task { await model.signOut() } }
            }
        }
    }
}

struct CallRow: View {
    let model: PhoneModel
    let call: PhoneModel.Call

    var body: some View {
        VStack(alignment: .leading, spacing: 12) {
            HStack {
                Text(call.remote?.rawValue ?? "Unknown").font(.headline)
                Spacer()
                Text(phaseText).foregroundStyle(.secondary)
            }
            if call.calleeOffline { Text("Nobody answers: they are offline.").font(.footnote) }
            if call.video, call.phase == .connected {
                ZStack(alignment: .bottomTrailing) {
                    VideoView(track: model.media?.remoteVideoTrack).aspectRatio(3 / 4, contentMode: .fit)
                    VideoView(track: model.media?.localVideoTrack).frame(width: 90, height: 120).padding(8)
                }
                .accessibilityLabel("Video")
            }
            if let bars = call.bars, let mos = call.mos {
                QualityBars(bars: bars).accessibilityLabel(String(format: "Call quality %d of 5, MOS %.1f", bars, mos))
            }
            if call.remoteMuted { Text("\(call.remote?.rawValue ?? "They") muted their microphone").font(.footnote) }
            if call.remoteHeld { Text("On hold by \(call.remote?.rawValue ?? "them")").font(.footnote) }
            HStack(spacing: 16) {
                if call.phase == .ringing && !call.outgoing {
                    Button("Answer") { Task { await model.answer(call.id) } }.buttonStyle(.borderedProminent).tint(.green)
                }
                Toggle(isOn: Binding(get: { call.muted }, set: { _ in Task { await model.toggleMute(call.id) } })) {
                    Image(systemName: call.muted ? "mic.slash.fill" : "mic.fill")
                }.toggleStyle(.button).accessibilityLabel("Mute")
                Toggle(isOn: Binding(get: { call.held }, set: { _ in Task { await model.toggleHold(call.id) } })) {
                    Image(systemName: "pause.fill")
                }.toggleStyle(.button).accessibilityLabel("Hold")
                Toggle(isOn: Binding(get: { call.speaker }, set: { _ in Task { await model.toggleSpeaker(call.id) } })) {
                    Image(systemName: "speaker.wave.3.fill")
                }.toggleStyle(.button).accessibilityLabel("Speaker")
                RoutePicker().frame(width: 32, height: 32).accessibilityLabel("Audio route")
                Spacer()
                Button(role: .destructive) { Task { await model.hangUp(call.id) } } label: {
                    Image(systemName: "phone.down.fill")
                }.accessibilityLabel("Hang up")
            }
            .buttonStyle(.bordered)
        }
        .padding(.vertical, 4)
    }

    private var phaseText: String {
        switch call.phase {
        case .dialing: "Calling…"
        case .ringing: call.outgoing ? "Ringing…" : "Incoming call"
        case .answering, .connecting: "Connecting…"
        case .connected: call.held ? "On hold" : "Connected"
        case .ended: "Ended"
        }
    }
}

/// The system's route picker (receiver, speaker, AirPods, the car): AVRoutePickerView.
struct RoutePicker: UIViewRepresentable {
    func makeUIView(context: Context) -> AVRoutePickerView {
        let picker = AVRoutePickerView()
        picker.prioritizesVideoDevices = false
        return picker
    }

    func updateUIView(_ uiView: AVRoutePickerView, context: Context) {}
}

struct QualityBars: View {
    let bars: Int

    var body: some View {
        HStack(alignment: .bottom, spacing: 2) {
            ForEach(1...5, id: \.self) { bar in
                RoundedRectangle(cornerRadius: 1)
                    .fill(bar <= bars ? Color.green : Color.gray.opacity(0.3))
                    .frame(width: 4, height: CGFloat(4 + bar * 3))
            }
        }
    }
}
