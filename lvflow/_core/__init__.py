"""What every part of lvflow shares: its exceptions (`errors`) and its input checks (`validate`)."""
