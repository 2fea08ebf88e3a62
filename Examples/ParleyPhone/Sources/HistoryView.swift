import ParleyApple
import SwiftUI

struct HistoryView: View {
    let model: PhoneModel
    let user: UserID

    var body: some View {
        List(model.history, id: \.call) { record in
            let outgoing = record.caller == user
            HStack {
                Image(systemName: outgoing ? "phone.arrow.up.right" : "phone.arrow.down.left")
                    .foregroundStyle(record.answeredAt == nil ? .red : .primary)
                VStack(alignment: .leading) {
                    Text(outgoing ? record.callee.rawValue : record.caller.rawValue).font(.headline)
                    Text(Date(timeIntervalSince1970: TimeInterval(record.createdAt) / 1000), style: .relative).font(.footnote)
                }
                Spacer()
                if let duration = record.duration {
                    Text(Duration.seconds(duration).formatted(.time(pattern: .minuteSecond)))
                } else {
                    Text(record.reason?.rawValue ?? "").foregroundStyle(.secondary)
                }
            }
        }
        .navigationTitle("Recent calls")
        .task { await model.refreshHistory() }
        .refreshable { await model.refreshHistory() }
    }
}
