import ParleyKit
