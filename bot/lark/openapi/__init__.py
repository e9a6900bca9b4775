"""What Ethan reads from Lark's Open API: the client, chats, display names, message resources,
quoted messages, a group's discussion."""
