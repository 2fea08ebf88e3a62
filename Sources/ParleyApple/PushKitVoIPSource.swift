// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import Foundation
import ParleyKit
import PushKit

/// The app's PushKit registry, one per process (`CallSystem` makes it at launch: a VoIP push that
/// wakes a killed app is delivered only to a registry that exists by the end of launch).
///
/// Every VoIP push is reported to CallKit inside the delegate method, as Apple's sample does, before
/// any actor, phone or network is reached, and completed from the report's completion — also when
/// no phone is signed in (reported, then ended) and when the payload is not Parley's. What the push
/// means is the core's (`VoIPPushReport`); a running phone then takes the call
/// (`VoIPPushEvent.reported`) and the token (`subscribe()`).
public final class PushKitVoIPSource: NSObject, VoIPPushSource, PKPushRegistryDelegate, @unchecked Sendable {
    /// The registry, created with the source.
    public let registry: PKPushRegistry
    private let callKit: CallKitProvider
    private let lock = NSLock()
    /// The running phone's stream, if one is signed in.
    private var listener: (id: UInt64, sink: AsyncStream<VoIPPushEvent>.Continuation)?
    private var listeners: UInt64 = 0

    /// - Parameter queue: where PushKit calls the delegate. The main queue (the default) delivers a
    ///   push that launched the app after `didFinishLaunching` returns, once the app had its chance to
    ///   start the signed-in user's phone.
    init(callKit: CallKitProvider, queue: DispatchQueue = .main) {
        self.callKit = callKit
        registry = PKPushRegistry(queue: queue)
        super.init()
        registry.delegate = self
        registry.desiredPushTypes = [.voIP]
    }

    /// The events for the phone that runs now: the token PushKit holds at once, then each new token
    /// and each reported push. A newer subscription ends this one; the source itself never ends.
    public func subscribe() -> AsyncStream<VoIPPushEvent> {
        let (stream, sink) = AsyncStream.makeStream(of: VoIPPushEvent.self)
        let (id, previous) = lock.withLock { () -> (UInt64, AsyncStream<VoIPPushEvent>.Continuation?) in
            listeners += 1
            defer { listener = (listeners, sink) }
            return (listeners, listener?.sink)
        }
        previous?.finish()
        sink.onTermination = { [weak self] _ in
            guard let self else { return }
            lock.withLock { if listener?.id == id { listener = nil } }
        }
        // A token PushKit already has is not announced again: every phone registers it.
        if let token = registry.pushToken(for: .voIP) { sink.yield(.token(token)) }
        return stream
    }

    public func pushRegistry(_ registry: PKPushRegistry, didUpdate pushCredentials: PKPushCredentials, for type: PKPushType) {
        guard type == .voIP else { return }
        lock.withLock { listener?.sink }?.yield(.token(pushCredentials.token))
    }

    public func pushRegistry(_ registry: PKPushRegistry, didInvalidatePushTokenFor type: PKPushType) {
        guard type == .voIP else { return }
        lock.withLock { listener?.sink }?.yield(.tokenInvalidated)
    }

    public func pushRegistry(_ registry: PKPushRegistry, didReceiveIncomingPushWith payload: PKPushPayload, for type: PKPushType,
                             completion: @escaping () -> Void) {
        let body = (try? JSONSerialization.data(withJSONObject: payload.dictionaryPayload)) ?? Data()
        let phone = lock.withLock { listener?.sink }
        let push = VoIPPushReport(payload: body, phoneRunning: phone != nil)
        let done = UncheckedCompletion(completion)
        callKit.reportPushedCall(push) { ringing in
            if ringing { phone?.yield(.reported(push)) }
            done.run()
        }
    }
}

/// PushKit's completion handler is not `Sendable`; it is safe to call from any thread.
private struct UncheckedCompletion: @unchecked Sendable {
    let completion: () -> Void
    init(_ completion: @escaping () -> Void) { self.completion = completion }
    func run() { completion() }
}
#endif
