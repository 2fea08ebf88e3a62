import Foundation
import ParleyApple
import ParleyKit
import ParleyProtocol
import ParleyServer
import ParleyServerTesting
import Testing

extension OneIPhone {
    /// The iPhone's way into a LAN listener, against the real server in LAN mode.
    @Suite("LAN tokens from the iPhone")
    struct LANTokenTests {
        @Test func theRightPINGetsATokenTheServerTakesAndAWrongOneIsRefusedInItsWords() async throws {
            let server = try await LiveServer.start {
                $0.developmentMode = false
                $0.lan = LANSettings(host: "bob", pin: "2468")
                $0.tokenKey = .hs256(secret: String(repeating: "k", count: 40))
            }
            let listener = try #require(LANService.listener(instance: "Bob on laptop", host: "127.0.0.1", port: server.port,
                                                            txt: LANService.txt(user: "bob", name: "Bob", pinRequired: true)))
            let token = try await LANToken.fetch(from: listener, user: "alice", name: "Alice", pin: "2468")
            // The token opens the listener's signaling endpoint (its ordinary HTTP answer, without the upgrade).
            #expect(try await server.http("GET", "/v1/signal", token: token).status == 426)
            #expect(try await server.http("GET", "/v1/signal", token: "forged").status == 401)

            await #expect {
                _ = try await LANToken.fetch(from: listener, user: "alice", name: nil, pin: "1111")
            } throws: { error in
                guard let refused = error as? LANToken.Refused else { return false }
                return refused.status == 403 && refused.description == "Bob refused: wrong PIN"
            }
            await #expect {
                _ = try await LANToken.fetch(from: listener, user: "bob", name: nil, pin: "2468")
            } throws: { error in (error as? LANToken.Refused)?.status == 409 }
            try await server.stop()
        }
    }
}
