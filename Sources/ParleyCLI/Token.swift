import ArgumentParser
import Foundation
import ParleyProtocol
import ParleyServer

struct Token: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Mint an access token for a user.")

    @Argument(help: "The user id (1-64 characters of A-Z a-z 0-9 . _ @ -).")
    var user: String

    @Option(help: "Display name carried in the token.")
    var name: String?

    @Option(help: "Secret the server signs tokens with. [PARLEY_TOKEN_SECRET]")
    var secret: String?

    @Option(help: "Lifetime in seconds.")
    var ttl: Int = 24 * 3600

    func validate() throws {
        guard UserID(rawValue: user) != nil else { throw ValidationError("'\(user)' is not a valid user id: use 1-64 characters of A-Z a-z 0-9 . _ @ -") }
        guard ttl > 0 else { throw ValidationError("--ttl must be positive") }
    }

    func run() async throws {
        let secret = secret ?? Serve.env("PARLEY_TOKEN_SECRET") ?? ServerConfiguration.developmentSecret
        let authority = try await TokenAuthority(key: .hs256(secret: secret))
        let minted = try await authority.mint(user: UserID(rawValue: user)!, name: name, lifetime: .seconds(ttl))
        print(minted.token)
    }
}
