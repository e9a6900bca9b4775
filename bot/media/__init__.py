"""What comes with a message besides text: attachments, the untrusted-file readers and their
parse worker pool, voice (audio, speech to text)."""
