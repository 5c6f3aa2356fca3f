"""What a lent GPU machine needs from here, packed to fit its transfers."""
