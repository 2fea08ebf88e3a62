import ParleyApple
import SwiftUI

/// A group voice room (AudioBridge on the server's Janus): who is there, who talks, mute, leave.
struct RoomView: View {
    let model: PhoneModel
    @State private var name = "lobby"

    var body: some View {
        List {
            if let room = model.room {
                Section(room.reconnecting ? "Reconnecting…" : room.connected ? "In \(room.name.rawValue)" : "Joining \(room.name.rawValue)…") {
                    ForEach(room.members, id: \.id) { member in
                        HStack {
                            Image(systemName: room.talking.contains(member.id) ? "waveform" : "person.fill")
                                .foregroundStyle(room.talking.contains(member.id) ? .green : .secondary)
                            Text(member.isSelf ? "\(member.display) (you)" : member.display)
                            Spacer()
                            if room.mutedMembers.contains(member.id) || (member.isSelf && room.muted) {
                                Image(systemName: "mic.slash").accessibilityLabel("muted")
                            }
                        }
                        .accessibilityElement(children: .combine)
                    }
                }
                Section {
                    Button(room.muted ? "Unmute" : "Mute") { Task { await model.toggleRoomMute() } }
                    Button("Leave", role: .destructive) { Task { await model.leaveRoom() } }
                }
            } else {
                Section("Room") {
                    TextField("room name", text: $name).textInputAutocapitalization(.never).autocorrectionDisabled()
                    Button("Join") { Task { await model.joinRoom(name) } }.disabled(name.isEmpty)
                }
            }
        }
        .navigationTitle("Voice room")
    }
}
