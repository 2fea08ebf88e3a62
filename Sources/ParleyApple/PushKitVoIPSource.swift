import Foundation
import ParleyKit
import PushKit

/// The SDK's `VoIPPushSource` over PushKit. Create it at launch (in the app delegate's
/// `didFinishLaunching`): a VoIP push that wakes a killed app is delivered only to a registry that
/// exists by then. What to do with tokens and pushes is the core's (`VoIPPushCoordinator`).
public final class PushKitVoIPSource: NSObject, VoIPPushSource, PKPushRegistryDelegate, @unchecked Sendable {
    public let events: AsyncStream<VoIPPushEvent>
    private let sink: AsyncStream<VoIPPushEvent>.Continuation
    /// The registry, created with the source (at launch).
    public let registry: PKPushRegistry

    public init(queue: DispatchQueue = DispatchQueue(label: "net.parley.pushkit")) {
        (events, sink) = AsyncStream.makeStream()
        registry = PKPushRegistry(queue: queue)
        super.init()
        registry.delegate = self
        registry.desiredPushTypes = [.voIP]
        // A token PushKit already has is not always announced again: hand it over at once.
        if let token = registry.pushToken(for: .voIP) { sink.yield(.token(token)) }
    }

    public func pushRegistry(_ registry: PKPushRegistry, didUpdate pushCredentials: PKPushCredentials, for type: PKPushType) {
        guard type == .voIP else { return }
        sink.yield(.token(pushCredentials.token))
    }

    public func pushRegistry(_ registry: PKPushRegistry, didInvalidatePushTokenFor type: PKPushType) {
        guard type == .voIP else { return }
        sink.yield(.tokenInvalidated)
    }

    public func pushRegistry(_ registry: PKPushRegistry, didReceiveIncomingPushWith payload: PKPushPayload, for type: PKPushType,
                             completion: @escaping () -> Void) {
        // The core reports the call to CallKit before it runs the completion, whatever the payload says.
        let body = (try? JSONSerialization.data(withJSONObject: payload.dictionaryPayload)) ?? Data()
        let done = UncheckedCompletion(completion)
        sink.yield(.push(body, completion: { done.run() }))
    }
}

/// PushKit's completion handler is not `Sendable`; it is safe to call from any thread.
private struct UncheckedCompletion: @unchecked Sendable {
    let completion: () -> Void
    init(_ completion: @escaping () -> Void) { self.completion = completion }
    func run() { completion() }
}
